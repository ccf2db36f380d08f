"""Words the key-term finder weighs: stop words and function words (English and
CJK), the CJK verbs, and how an English phrase is normalised (:func:`en_key`).
"""

from __future__ import annotations

import functools
import re

CJK_RUN_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]{2,}")


CJK_STOP = frozenset(
    "的了是在和与及也把被就都而或能会这那个为以其之于中上下到从对等并它他她们我你有让使将所可即又很更最"
)


EN_TOKEN_RE = re.compile(r"[A-Za-z0-9]+(?:['\-][A-Za-z0-9]+)*\+?")


def word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


EN_STOP = word_set(
    "a an the and or but nor so yet if of to in on at by for with from into onto as than then "
    "is are was were be been being am do does did done doing has have had having can could may "
    "might must shall should will would it its it's this that these those they them their theirs "
    "he him his she her hers we us our ours you your yours i me my mine who whom whose which what "
    "when where why how all any both each every either neither few more most much many other "
    "another some such no not only own same very too also just even still again once here there "
    "about above after against along among around before behind below beneath beside between "
    "beyond down during except inside near off out outside over past per since through "
    "throughout toward towards under until up upon within without via whether while because "
    "although though however therefore thus hence instead rather quite almost nearly roughly "
    "about approximately often usually always never sometimes soon already perhaps probably "
    "simply exactly really actually especially mainly mostly largely partly fully directly "
    "first second third last next new old good better best bad worse worst great little large "
    "small big long short high low certain several various whole half one two three four five "
    "six seven eight nine ten twelve hundred thousand million billion way ways thing things "
    "something anything nothing everything kind kinds sort lot lots part parts number numbers "
    "make makes made making take takes took taken taking give gives gave given giving get gets "
    "got use uses used using called call calls known know knows need needs needed keep keeps "
    "kept let lets put puts see sees seen say says said tell tells told find finds found look "
    "looks looked show shows shown come comes came go goes went gone become becomes became "
    "work works worked happen happens happened mean means meant refer refers referred seem "
    "seems like unlike well able unable possible likely enough less least further example "
    "instance case cases fact idea way rest end ends start starts begin begins form forms "
    "version versions time times day days year years same different important useful simple "
    "true false yes began begun grew grown led held ran lost left gained spent sent brought "
    "thought bought stood fell rose won fed reduce reduces produce produces absorb absorbs "
    "contain contains allow allows carry carries convert converts remove removes provide "
    "provides require requires depend depends cause causes create creates increase increases "
    "decrease decreases replace replaces explain explains"
)


CJK_FUNCTION_WORDS = (
    "主要",
    "可以",
    "能够",
    "进行",
    "通过",
    "一定",
    "需要",
    "没有",
    "不是",
    "这些",
    "一些",
    "许多",
    "已经",
    "同时",
    "最终",
    "首先",
    "接着",
    "最后",
    "此外",
    "因此",
    "所以",
    "因为",
    "如果",
    "但是",
    "而且",
    "以及",
    "几乎",
    "所有",
    "之间",
    "作为",
    "看起来",
    "归根结底",
    "值得注意",
    "重新",
    "不再",
    "一部分",
    "直接",
    "越高",
    "越快",
    "越强",
)


#: Common CJK verbs: poor cloze answers and poor distractors for nouns.
CJK_VERBS = word_set(
    "吸收 释放 产生 生成 形成 结合 影响 提供 储存 分解 增加 减少 合成 利用 发生 传递 推动 还原 "
    "保护 维持 转化 覆盖 积累 证明 包着 充满 悬浮 叠在 流回 关闭 下降 提高 延长 需要 使用 含有"
)


@functools.lru_cache(maxsize=8192)
def en_key(phrase: str) -> str:
    """Case- and plural-insensitive key of an English phrase."""
    words = []
    for w in phrase.lower().split():
        if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
            w = w[:-1]
        words.append(w)
    return " ".join(words)


@functools.lru_cache(maxsize=8192)
def is_acronym(word: str) -> bool:
    return sum(1 for c in word if c.isupper()) >= 2 or (
        any(c.isdigit() for c in word) and any(c.isalpha() for c in word)
    )


def content_token(tok: str) -> bool:
    low = tok.lower()
    if low in EN_STOP or low.rstrip("s") in EN_STOP or low.isdigit():
        return False
    if any(c.isdigit() for c in tok):
        return any(c.isalpha() for c in tok)
    return len(tok) >= 3 or is_acronym(tok)
