"""The prompt template sandbox (reference §10.4) attacked with the Jinja2 server-side
template injection payloads of public reports (PayloadsAllTheThings' "Jinja2" SSTI
list, HackTricks' Jinja2 SSTI page, PortSwigger's research on sandbox escapes, the
CVEs of the ``str.format`` and ``|attr`` bypasses of Jinja2's own sandbox): each is
refused at upload or renders nothing harmful, and neither the platform key nor the
process environment reaches any rendered prompt.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import jinja2
import pytest

from airuntime_common import jobtypes
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.prompts import (
    TEMPLATE_DIR,
    PromptTemplate,
    builtin_source,
    builtin_template,
    compile_prompt,
    render_messages,
    sample_context,
    validate_upload,
)
from airuntime_common.prompts.sandbox import MAX_OUTPUT_BYTES, guard_tree, sandbox

CANARY_KEY = "sk-canary-platform-key-7f3a9c"
CANARY_ENV = "canary-environment-value-51d2"
JOB_TYPE = "quiz_generation"

#: (name, the expression or statement put in the system block). Public reports of
#: Jinja2 SSTI and sandbox escapes; the comment says where each comes from.
ESCAPES: list[tuple[str, str]] = [
    # the classic MRO walk to every class of the process (PayloadsAllTheThings)
    ("mro_subclasses", "{{ ''.__class__.__mro__[1].__subclasses__() }}"),
    ("mro_index_file", "{{ ''.__class__.__mro__[2].__subclasses__()[40]('/etc/passwd').read() }}"),
    ("base_subclasses_loop", "{% for c in [].__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}"),
    # globals of the default template globals (HackTricks: cycler / joiner / namespace / lipsum)
    ("cycler_popen", "{{ cycler.__init__.__globals__.os.popen('id').read() }}"),
    ("joiner_globals", "{{ joiner.__init__.__globals__ }}"),
    ("namespace_globals", "{{ namespace.__init__.__globals__ }}"),
    ("lipsum_globals", "{{ lipsum.__globals__['os'].popen('id').read() }}"),
    ("lipsum_bare", "{{ lipsum.__globals__ }}"),
    ("range_self", "{{ range.__self__ }}"),
    # the template's own references (self, the Flask objects of most reports)
    ("self_context", "{{ self._TemplateReference__context }}"),
    ("self_dict", "{{ self.__dict__ }}"),
    ("self_bare", "{{ self }}"),
    ("config", "{{ config }}"),
    ("config_items", "{{ config.items() }}"),
    ("request_builtins", "{{ request.application.__globals__.__builtins__.__import__('os') }}"),
    ("dict_global", "{{ dict(a=1) }}"),
    # str.format / format_map attribute walks (CVE-2016-10745, CVE-2019-10906)
    ("format_globals", "{{ ''.format.__globals__ }}"),
    ("format_attr", "{{ '{0.__class__}'.format(job_type) }}"),
    ("format_init_globals", "{{ '{0.__init__.__globals__}'.format(job_type) }}"),
    ("format_map", "{{ '{x.__class__}'.format_map({'x': job_type}) }}"),
    # |attr() filter chains (the usual filter bypass)
    ("attr_chain", "{{ job_type|attr('__class__')|attr('__mro__') }}"),
    ("attr_hex", "{{ job_type|attr('\\x5f\\x5fclass\\x5f\\x5f') }}"),
    ("map_attr", "{{ [job_type]|map(attribute='__class__')|list }}"),
    # subscripts that spell an attribute (escaped, or built at render time)
    ("item_class", "{{ job_type['__class__'] }}"),
    ("item_unicode_escape", "{{ job_type['\\u005f\\u005fclass\\u005f\\u005f'] }}"),
    ("item_built", "{{ job_type['_' * 2 ~ 'class' ~ '_' * 2] }}"),
    ("item_built_mro", "{{ (job_type['_' ~ '_class_' ~ '_'])['_' ~ '_mro_' ~ '_'] }}"),
    ("set_then_walk", "{% set c = job_type.__class__ %}{{ c }}"),
    ("loop_class", "{% for x in [1] %}{{ loop.__class__.__init__.__globals__ }}{% endfor %}"),
    # mutation of shared objects, import and file access
    ("list_append", "{% set l = [] %}{{ l.append(1) }}"),
    ("dict_update", "{% set d = {} %}{{ d.update(a=1) }}"),
    ("include_passwd", "{% include '/etc/passwd' %}"),
    ("import_os", "{% import 'os' as os %}{{ os }}"),
    ("from_import", "{% from 'os' import popen %}{{ popen('id') }}"),
    ("extends", "{% extends '/etc/passwd' %}"),
    ("macro_recursion", "{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('a') }}"),
    ("call_block", "{% call(x) range(3) %}{{ x }}{% endcall %}"),
    ("encode_decode", "{{ job_type.encode('utf-8') }}"),
    # resource exhaustion (format-string and repetition bombs, nested loops)
    ("repeat_format", "{{ '%s' * 10**8 }}"),
    ("repeat_a", "{{ 'a' * 99999999 }}"),
    ("percent_format", "{{ '%999999999d' % 1 }}"),
    ("pow_bomb", "{{ 9 ** 9 ** 9 }}"),
    ("center_bomb", "{{ 'x'|center(999999999) }}"),
    ("ljust_bomb", "{{ 'x'.ljust(999999999) }}"),
    ("replace_bomb", "{{ snapshot_json.replace('\"', snapshot_json).replace('\"', snapshot_json) }}"),
    ("concat_doubling", "{% set a = snapshot_json ~ snapshot_json %}{% set b = a ~ a %}"
     "{% set c = b ~ b %}{% set d = c ~ c %}{% set e = d ~ d %}{% set f = e ~ e %}"
     "{% set g = f ~ f %}{% set h = g ~ g %}{% set i = h ~ h %}{{ i|length }}"),
    ("nested_loops", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
    ("output_flood", "{% for i in range(100000) %}{{ snapshot_json }}{% endfor %}"),
    ("join_bomb", "{{ (range(99999)|list)|join(snapshot_json) }}"),
]  # fmt: skip

#: What no rendered prompt may hold (besides the canaries).
HARMFUL = ("<class", "__", "root:", "uid=", "function", "module", "Environ", "globals")


def _template(system: str) -> str:
    return "{% block system %}json\n" + system + "\n{% endblock %}{% block user %}x{% endblock %}"


@pytest.fixture(autouse=True)
def canaries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DEEPSEEK_API_KEY", CANARY_KEY)
    monkeypatch.setenv("AIRT_TEST_CANARY", CANARY_ENV)
    yield


def _assert_clean(text: str) -> None:
    assert CANARY_KEY not in text and CANARY_ENV not in text
    for value in os.environ.values():
        if len(value) >= 12:  # a path or secret of the process, not a common word
            assert value not in text, value[:40]


def test_there_are_at_least_fifteen_escapes() -> None:
    assert len(ESCAPES) >= 15
    assert len({name for name, _ in ESCAPES}) == len(ESCAPES)


@pytest.mark.parametrize(("name", "payload"), ESCAPES, ids=[n for n, _ in ESCAPES])
def test_an_escape_is_refused_or_renders_nothing_harmful(name: str, payload: str) -> None:
    source = _template(payload)
    started = time.monotonic()
    try:
        prompt = validate_upload(JOB_TYPE, source)
    except AppError as exc:
        assert exc.code == ErrorCode.INVALID_PROMPT_TEMPLATE
        assert exc.message.startswith("line "), exc.message
        _assert_clean(exc.message)
        assert time.monotonic() - started < 5
        return
    # accepted at upload: rendering it (again, as a worker would) yields nothing harmful
    system, user = render_messages(prompt, sample_context(JOB_TYPE))
    for text in (system, user):
        _assert_clean(text)
        for word in HARMFUL:
            assert word not in text, (name, word, text[:200])
        assert len(text.encode()) <= MAX_OUTPUT_BYTES


@pytest.mark.parametrize("job_type", jobtypes.names())
def test_no_shipped_prompt_carries_the_key_or_the_environment(job_type: str) -> None:
    system, user = render_messages(builtin_template(job_type), sample_context(job_type))
    _assert_clean(system + user)


def test_the_shipped_templates_render_as_before_the_sandbox() -> None:
    """Inlining the include and rendering in the sandbox changes no byte of a prompt."""
    plain = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(TEMPLATE_DIR)]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
    )
    for job_type in jobtypes.names():
        for note in (
            "",
            "Note: the snapshot was shortened to fit; left out from the end: 3 blocks.",
        ):
            ctx = {**sample_context(job_type), "truncation_note": note}
            t = plain.get_template(f"{job_type}.v1.j2")
            before = tuple(
                "".join(t.blocks[b](t.new_context(ctx))).strip() for b in ("system", "user")
            )
            assert render_messages(builtin_template(job_type), ctx) == before
        assert "include" not in builtin_source(job_type)


@pytest.mark.parametrize(
    ("source", "line", "words"),
    [
        ("{% block system %}json\n\n{{ nope }}{% endblock %}{% block user %}x{% endblock %}", 3, "nope"),
        ("{% block system %}json\n{% if %}{% endblock %}{% block user %}x{% endblock %}", 2, ""),
        ("{% block system %}json{% endblock %}\n{% block user %}\n\n\n{{ job_type|format(1) }}"
         "{% endblock %}", 5, "format"),
        ("{% block system %}json{% endblock %}", 1, "user"),
        ("{% block system %}json{% endblock %}{% block user %}x{% endblock %}\n\nstray text", 3,
         "outside"),
        ("{% block system %}json\n{% for i in range(3) %}\n{{ i.__class__ }}{% endfor %}"
         "{% endblock %}{% block user %}x{% endblock %}", 3, "__class__"),
        ("{% block system %}json\n{% set x = 1 %}{% endblock %}{% block user %}\n{{ x }}"
         "{% endblock %}", 3, "undefined"),
        ("{% block system %}json\n\n\n\n{% for i in range(100000) %}{{ snapshot_json }}"
         "{% endfor %}{% endblock %}{% block user %}x{% endblock %}", 5, "larger than"),
        ("{% block system %}\nno word for the model's mode{% endblock %}{% block user %}x"
         "{% endblock %}", 1, "json"),
    ],
)  # fmt: skip
def test_a_bad_template_names_its_line(source: str, line: int, words: str) -> None:
    with pytest.raises(AppError) as caught:
        validate_upload(JOB_TYPE, source)
    assert caught.value.code == ErrorCode.INVALID_PROMPT_TEMPLATE
    assert caught.value.message.startswith(f"line {line}:"), caught.value.message
    assert words in caught.value.message
    assert caught.value.details == {"line": line}


def test_what_a_template_may_do_still_works() -> None:
    source = (
        "{% block system %}TASK: quiz_generation\n"
        "{% set n = params_json|length %}{% for w in ['a', 'b'] %}{{ loop.index }}{{ w|upper }}"
        "{{ loop.cycle('-', '+') }}{% endfor %} json {{ job_type.replace('_', ' ')|title }} "
        "{{ '%d' if n > 1 else 'none' }} {{ (snapshot_json|length > 10) and 'long' }}"
        "{% endblock %}{% block user %}<snapshot>\n{{ snapshot_json }}\n</snapshot>"
        "{{ truncation_note|default('', true) }}{% endblock %}"
    )
    system, user = render_messages(validate_upload(JOB_TYPE, source), sample_context(JOB_TYPE))
    assert system == "TASK: quiz_generation\n1A-2B+ json Quiz Generation %d long"
    assert user.startswith("<snapshot>\n{") and "blk_sample_1" in user


def test_a_render_is_bounded_in_time() -> None:
    """Busy loops that output nothing stop at the iteration budget, well within seconds."""
    source = _template(
        "{% for i in range(100000) %}{% if snapshot_json.count('a') %}{% endif %}{% endfor %}"
        "{% for i in range(100000) %}{% for j in range(3) %}{% endfor %}{% endfor %}"
    )
    started = time.monotonic()
    with pytest.raises(AppError, match=r"line 2: .*(loops|longer)"):
        validate_upload(JOB_TYPE, source)
    assert time.monotonic() - started < 5


def test_compile_refuses_a_huge_source() -> None:
    with pytest.raises(AppError, match="line 1: the template is longer"):
        compile_prompt(_template("x" * 300_000))


@pytest.mark.parametrize(("name", "payload"), ESCAPES, ids=[n for n, _ in ESCAPES])
def test_the_sandbox_alone_holds_every_escape(name: str, payload: str) -> None:
    """Defence in depth: the same payloads compiled *without* the upload's structural
    checks (as if one slipped past them) are stopped by the render-time sandbox."""
    env = sandbox()
    source = _template(payload)
    try:
        template = env.from_string(guard_tree(env.parse(source)))
        prompt = PromptTemplate(source, template)
    except jinja2.TemplateError:
        return  # e.g. a filter the sandbox does not have: refused at compile time
    try:
        system, user = render_messages(prompt, sample_context(JOB_TYPE))
    except AppError as exc:
        assert exc.code == ErrorCode.INVALID_PROMPT_TEMPLATE
        _assert_clean(exc.message)
        return
    for text in (system, user):
        _assert_clean(text)
        for word in HARMFUL:
            assert word not in text, (name, word, text[:200])
