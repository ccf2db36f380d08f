"""Sentence shapes that a question or a flashcard front is made from: a definition
("X is a …", "X means …", "X是…"), a naming ("… is called X"), a cause ("…, which
is why …", "… because …", "…，因此…"), and the checks that the matched subject or
term reads well as one ("What is X?").
"""

from __future__ import annotations

import re

from model_standin.answers.lexicon import EN_STOP, is_acronym

DEF_IS_RE = re.compile(
    r"^(?P<subj>[A-Z][^,;:()]{1,60}?)\s+(?P<verb>is|are)\s+(?P<det>a|an|the|one|any)\s+(?P<rest>.{6,})$"
)


DEF_MEANS_RE = re.compile(
    r"^(?P<subj>[A-Z][^,;:()]{1,60}?)\s+(?:means|refers to)\s+(?P<rest>.{6,})$"
)


NAMED_RE = re.compile(
    r"^(?P<desc>.{8,160}?)\s+(?:is|are)\s+(?:usually |often |also |sometimes )?"
    r"(?:called|known as|named)\s+(?P<term>[^,;.]{2,50}?)[.!]$"
)


SHORT_IS_RE = re.compile(
    r"^(?P<subj>The [a-z][^,;:()]{3,60}?)\s+(?P<verb>is|are)\s+"
    r"(?P<ans>(?:(?:a|an|the) )?[A-Za-z0-9][\w\-+]*(?: [\w\-+]+){0,2})[.!]$"
)


LIST_DEF_RE = re.compile(r"^(?P<term>[A-Za-z][A-Za-z0-9 \-']{1,40}):\s+(?P<rest>.{10,})$")


WHY_RE = re.compile(r"^(?P<head>.{10,}?),?\s+which is why\s+(?P<claim>[^;]{6,}?)[.!]$")


BECAUSE_RE = re.compile(r"^(?P<claim>[A-Z][^;]{10,}?),?\s+because\s+(?P<reason>.{6,})$")


PRONOUN_START_RE = re.compile(
    r"^(?:it|this|that|these|those|they|them|he|she|we|you|its|their|there|here|then|such|so|"
    r"and|but|or|also|both|another|each|the same)\b",
    re.IGNORECASE,
)


ZH_DEF_RE = re.compile(r"^(?P<subj>[^，,。：:、（(的]{2,12}?)(?:是指|是|指的是)(?P<rest>.{4,})$")


ZH_NAMED_RE = re.compile(
    r"(?:叫作|叫做|称为|简称|也叫|被称为)(?P<term>[\u3400-\u9fffA-Za-z0-9\-]{2,12}?)(?=的|[，,。！？；）)]|$)"
)


ZH_WHY_RE = re.compile(
    r"^(?P<cause>.{4,}?)[，,](?:所以|因此|因而)(?P<effect>[^，,。！？；]{3,})[。！？；]$"
)


ZH_PRONOUN_START = ("它", "这", "此", "其", "他", "她", "该", "那")


_SUBJECT_WORDS = frozenset(("the", "a", "an", "of", "and"))


CALLED_END_RE = re.compile(
    r"\b(?:called|known as|named)\s+(?P<the>the\s+)?"
    r"(?P<term>[A-Za-z0-9][\w\-+]*(?: [\w\-+]+){0,3})[.!]$"
)


def is_plural(term: str) -> bool:
    last = term.split()[-1] if term.split() else term
    return last.endswith("s") and not last.endswith(("ss", "us", "is", "sis")) and last.islower()


def words_ok(term: str) -> bool:
    """A term of 1–4 words that are not function words."""
    words = term.split()
    return 1 <= len(words) <= 4 and all(w.lower() not in EN_STOP for w in words)


def desc_ok(desc: str) -> bool:
    """A description usable as "What is <desc> called?" (a noun phrase, no clause before it)."""
    first = desc.split()[0].lower() if desc.split() else ""
    return "," not in desc and (first in ("the", "a", "an") or first not in EN_STOP)


def short_ok(m: re.Match[str]) -> bool:
    """A "The X is Y." sentence whose Y is a short noun phrase."""
    words = [w for w in m.group("ans").split() if w.lower() not in ("a", "an", "the")]
    return bool(words) and subject_ok(m.group("subj")) and words[0].lower() not in EN_STOP


def subject_ok(subj: str) -> bool:
    """True for a short noun-phrase-like subject ("Binary search", "The main pigment of X")."""
    words = subj.split()
    if not 1 <= len(words) <= 6 or PRONOUN_START_RE.match(subj):
        return False
    return all(w.lower() in _SUBJECT_WORDS or w.lower() not in EN_STOP for w in words)


def decap(phrase: str) -> str:
    first = phrase.split()[0] if phrase.split() else phrase
    if is_acronym(first) or (first[:1].isupper() and first[1:2].isupper()):
        return phrase
    return phrase[:1].lower() + phrase[1:]
