"""Hostile input to the parsers (property-based, hypothesis): job specs, settings and the
capabilities a node reports.

The contract under test: whatever arrives — arbitrary JSON-like data, a valid spec with one field
of the wrong type, missing or extra, huge or negative numbers, huge or exotic strings, arbitrary
bytes in a file, truncated or not UTF-8, deeply nested or alias-bombed YAML — a parser either
returns a valid model or raises its own classified error (JobSpecError, ConfigError,
ValidationError) whose message names the field; never any other exception.

Inputs the parsers once crashed on (huge integers, deep nesting, infinities, an empty extra key)
are pinned by dedicated tests at the end of each section, named after the behaviour.
"""

from __future__ import annotations

import contextlib
import copy
import json
import locale
import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from temporalio.contrib.pydantic import pydantic_data_converter

from gpuprov.config import (
    MAX_JOIN_TOKEN_TTL_SECONDS,
    MAX_TTL_SECONDS,
    ConfigError,
    Settings,
    load_settings,
)
from gpuprov.models import (
    JOB_NAME_PATTERN,
    MAX_DISK_GB,
    MAX_GPU_NAME_LENGTH,
    MAX_HEALTH_CHECK_INTERVAL_SECONDS,
    MAX_HOURLY_COST,
    MAX_MEMORY_GB,
    MAX_PROVIDERS,
    MAX_PROVISIONING_TIMEOUT_SECONDS,
    MAX_REGION_LENGTH,
    MAX_REGIONS,
    MAX_SPEC_FILE_BYTES,
    MAX_VCPUS,
    JobSpec,
    JobSpecError,
    Placement,
    ReleasePolicy,
    Resources,
    WorkerCapabilities,
    load_job_spec,
    parse_job_spec,
)
from providers import PROVIDER_IDS

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FEW = settings(PROPERTY, max_examples=100)

# Over CPython's default int_max_str_digits (4300), int() of a digit string raises ValueError.
SAFE_BIG_INT = 10**4000
BIG_INT_DIGITS = "1" * 5000
DEEP = 1_200  # levels: past the recursion limit of every parser used (YAML and TOML ~500)
SHALLOW = 50

# ---------------------------------------------------------------------------- strategies

SPEC_FIELDS = sorted(JobSpec.model_fields)
ALL_FIELD_NAMES = sorted(
    {*JobSpec.model_fields, *Resources.model_fields, *Placement.model_fields}
    | set(WorkerCapabilities.model_fields)
    | {"gpu_per_node", "Name", "node", "gpus ", "provider", "region", ""}  # near misses
)
KEYS = st.sampled_from(ALL_FIELD_NAMES) | st.text(max_size=12)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)


def json_like(max_leaves: int = 15) -> st.SearchStrategy[Any]:
    """Arbitrary JSON-like data: dicts, lists, text, numbers, booleans and None."""
    return st.recursive(
        SCALARS,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4)
        ),
        max_leaves=max_leaves,
    )


HOSTILE_VALUES = st.one_of(
    SCALARS,
    st.sampled_from(
        [
            0,
            -1,
            -(2**63),
            2**63,
            2**64 + 1,
            10**30,
            -(10**30),
            SAFE_BIG_INT,
            -SAFE_BIG_INT,
            0.0,
            -0.0,
            -1.0,
            1e-320,
            1e308,
            -1e308,
            math.inf,
            -math.inf,
            math.nan,
            "",
            " ",
            "0",
            "1",
            "-1",
            "1e400",
            "true",
            "null",
            "NaN",
            "fake",
            "é",
            "名前",
            "🚀",
            "a\x00b",
            "\u202eevil",
            "line\nbreak",
            "x" * 20_000,
            "a" * 41,
            "job-",
            "-job",
            "Job",
        ]
    ),
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.text(max_size=5), SCALARS, max_size=3),
)

valid_resources = st.fixed_dictionaries(
    {},
    optional={
        "gpu": st.none() | st.text(min_size=1, max_size=20),
        "gpus_per_node": st.integers(0, 64),
        "min_vcpus": st.none() | st.integers(0, MAX_VCPUS),
        "min_memory_gb": st.none() | st.floats(0, MAX_MEMORY_GB),
        "min_disk_gb": st.none() | st.floats(0, MAX_DISK_GB),
        "spot": st.booleans(),
    },
)
valid_placement = st.fixed_dictionaries(
    {},
    optional={
        "provisioning": st.booleans(),
        "providers": st.none() | st.lists(st.sampled_from(PROVIDER_IDS), max_size=3),
        "regions": st.none() | st.lists(st.text(min_size=1, max_size=12), max_size=3),
    },
)
valid_specs = st.fixed_dictionaries(
    {"name": st.from_regex(JOB_NAME_PATTERN, fullmatch=True)},
    optional={
        "nodes": st.integers(1, 256),
        "resources": valid_resources,
        "placement": valid_placement,
        "max_hourly_cost": st.none() | st.floats(0, MAX_HOURLY_COST, exclude_min=True),
        "provisioning_timeout_seconds": st.integers(1, MAX_PROVISIONING_TIMEOUT_SECONDS),
        "release": st.sampled_from([policy.value for policy in ReleasePolicy]),
    },
)


def _slots(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a dict entry or list element inside `value`."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return []
    found: list[tuple[Any, ...]] = []
    for key, child in items:
        found.append((*path, key))
        found.extend(_slots(child, (*path, key)))
    return found


def _containers(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a dict inside `value`, the root included."""
    if not isinstance(value, dict):
        return []
    found = [path]
    for key, child in value.items():
        found.extend(_containers(child, (*path, key)))
    return found


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """A valid document with one to three hostile edits: a value of the wrong type or size, a
    missing field, or an extra one."""
    data = copy.deepcopy(draw(base))
    for _ in range(draw(st.integers(1, 3))):
        slots = _slots(data)
        operation = draw(st.sampled_from(["replace", "delete", "extra"] if slots else ["extra"]))
        if operation == "extra":
            where = _at(data, draw(st.sampled_from(_containers(data))))
            where[draw(KEYS)] = draw(HOSTILE_VALUES)
            continue
        *parent, key = draw(st.sampled_from(slots))
        container = _at(data, tuple(parent))
        if operation == "replace":
            container[key] = draw(HOSTILE_VALUES)
        elif isinstance(container, dict):
            del container[key]
        else:
            container.pop(key)
    return data


hostile_specs = mutated(valid_specs)

# ---------------------------------------------------------------------------- serialization


def _toml_string(text: str) -> str:
    # A TOML basic string: JSON's escapes are TOML's, but TOML also forbids a raw DEL.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # inf, -inf, nan and 1e+300 are TOML floats too
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{_toml_string(str(k))} = {_toml_value(v)}" for k, v in value.items())
            + "}"
        )
    return _toml_string(str(value))


def without_none(value: Any) -> Any:
    """The document TOML can carry: TOML has no null, so None values are left out, at any depth."""
    if isinstance(value, dict):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_none(item) for item in value if item is not None]
    return value


def to_toml(data: Any) -> str:
    """TOML for a JSON-like document (TOML has no null: None values are left out); top-level
    tables become [sections]. Anything but a mapping becomes text TOML cannot read."""
    if not isinstance(data, dict):
        return json.dumps(data)
    lines, sections = [], []
    for key, value in without_none(data).items():
        if isinstance(value, dict):
            sections.append(f"[{_toml_string(str(key))}]")
            sections.extend(f"{_toml_string(str(k))} = {_toml_value(v)}" for k, v in value.items())
        else:
            lines.append(f"{_toml_string(str(key))} = {_toml_value(value)}")
    return "\n".join(lines + sections) + "\n"


def serialize(data: Any, suffix: str) -> str:
    if suffix == ".json":
        return json.dumps(data)
    if suffix == ".toml":
        return to_toml(data)
    return yaml.safe_dump(data)


SUFFIXES = st.sampled_from([".json", ".yaml", ".yml", ".toml"])


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for the property tests' files (a function-scoped tmp_path would be shared
    by all of a test's examples anyway)."""
    return tmp_path_factory.mktemp("hostile")


# ---------------------------------------------------------------------------- assertions

LOAD_ERROR_PREFIXES = (
    "cannot read job spec",
    "job spec ",  # ... is not UTF-8 text
    "malformed job spec",
    "a job spec must be a mapping",
    "invalid job spec: ",
)


def assert_names_a_field(error: JobSpecError, data: Any) -> None:
    """The message of a rejected spec names what is wrong: the whole spec when it is not a
    mapping, else (first) a JobSpec field or one of the keys that was given."""
    message = str(error)
    if not isinstance(data, dict):
        assert message == f"a job spec must be a mapping, got {type(data).__name__}"
        return
    assert message.startswith("invalid job spec: "), message
    problems = message.removeprefix("invalid job spec: ")
    named = {*SPEC_FIELDS, *(str(key) if key != "" else '""' for key in data)}
    assert any(problems.startswith((f"{name}: ", f"{name}.")) for name in named), message[:500]


def assert_valid(spec: JobSpec) -> None:
    """A returned JobSpec really is valid: re-validating what it holds gives it back."""
    assert isinstance(spec, JobSpec)
    assert JobSpec.model_validate(spec.model_dump()) == spec


def check_parse(data: Any) -> JobSpec | None:
    try:
        spec = parse_job_spec(data)
    except JobSpecError as error:
        assert_names_a_field(error, data)
        return None
    assert_valid(spec)
    return spec


def check_load(path: Path) -> JobSpec | None:
    try:
        spec = load_job_spec(path)
    except JobSpecError as error:
        assert str(error).startswith(LOAD_ERROR_PREFIXES), str(error)[:500]
        if str(error).startswith("invalid job spec: "):
            assert ": " in str(error).removeprefix("invalid job spec: ")
        return None
    assert_valid(spec)
    return spec


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(item) for item in value.values())
    if isinstance(value, list):
        return all(_finite(item) for item in value)
    return True


# ---------------------------------------------------------------------------- parse_job_spec


@PROPERTY
@given(data=json_like())
def test_parse_arbitrary_data_returns_a_spec_or_a_job_spec_error(data: Any) -> None:
    check_parse(data)


@PROPERTY
@given(data=st.dictionaries(KEYS, json_like(6), max_size=6))
def test_parse_arbitrary_mappings_names_the_field(data: dict[str, Any]) -> None:
    check_parse(data)


@PROPERTY
@given(data=hostile_specs)
@example(data={"name": "0", "setup": "0"})  # a whole-spec rule (setup needs run) names setup
def test_parse_mutated_specs_returns_a_spec_or_names_the_field(data: dict[str, Any]) -> None:
    check_parse(data)


@PROPERTY
@given(data=valid_specs)
def test_valid_specs_parse_and_survive_the_trip_to_the_workflow(data: dict[str, Any]) -> None:
    """What the client starts a job with is what the workflow receives (the pydantic data
    converter's JSON); non-finite floats are the known exception, pinned below."""
    spec = parse_job_spec(data)
    assert_valid(spec)
    converter = pydantic_data_converter.payload_converter
    [received] = converter.from_payloads(converter.to_payloads([spec]), [JobSpec])
    assert received == spec


@pytest.mark.parametrize("field", ["name", "nodes", "resources", "placement", "release"])
def test_a_missing_or_wrong_typed_field_is_named(field: str) -> None:
    data: dict[str, Any] = {"name": "job1", field: ["not", "this"]}
    with pytest.raises(JobSpecError, match=rf"^invalid job spec: {field}[.:]"):
        parse_job_spec(data)
    with pytest.raises(JobSpecError, match=r"^invalid job spec: name: Field required"):
        parse_job_spec({})


def test_an_empty_extra_key_is_named() -> None:
    with pytest.raises(JobSpecError) as raised:
        parse_job_spec({"name": "job1", "": 1})
    assert "(spec)" not in str(raised.value)


@pytest.mark.parametrize(
    "field",
    [
        pytest.param({"max_hourly_cost": math.inf}, id="max_hourly_cost"),
        pytest.param({"resources": {"min_memory_gb": math.inf}}, id="min_memory_gb"),
        pytest.param({"resources": {"min_disk_gb": math.inf}}, id="min_disk_gb"),
    ],
)
def test_an_infinite_number_is_rejected_or_survives_the_trip(field: dict[str, Any]) -> None:
    try:
        spec = parse_job_spec({"name": "job1", **field})
    except JobSpecError:
        return  # rejected: fine
    converter = pydantic_data_converter.payload_converter
    [received] = converter.from_payloads(converter.to_payloads([spec]), [JobSpec])
    assert received == spec


# Each bounded field: (path, the largest accepted value, the smallest refused one).
BOUNDS = [
    (("provisioning_timeout_seconds",), MAX_PROVISIONING_TIMEOUT_SECONDS, 10**19),
    (("health_check_interval_seconds",), MAX_HEALTH_CHECK_INTERVAL_SECONDS, 10**19),
    (("nodes",), 256, 257),
    (("max_hourly_cost",), MAX_HOURLY_COST, 1e19),
    (("resources", "gpus_per_node"), 64, 65),
    (("resources", "min_vcpus"), MAX_VCPUS, MAX_VCPUS + 1),
    (("resources", "min_memory_gb"), MAX_MEMORY_GB, 1e300),
    (("resources", "min_disk_gb"), MAX_DISK_GB, 1e300),
    (("resources", "gpu"), "g" * MAX_GPU_NAME_LENGTH, "g" * 3000),
    (("placement", "regions"), ["r" * MAX_REGION_LENGTH] * MAX_REGIONS, ["r"] * 1000),
    (("placement", "regions", 0), "r" * MAX_REGION_LENGTH, "r" * 3000),
    (("placement", "providers"), ["fake"] * MAX_PROVIDERS, ["fake"] * 1000),
]


def _spec_with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    if path[-1] == 0:  # one element of a list
        path, value = path[:-1], [value]
    data: dict[str, Any] = {"name": "job1"}
    target = data
    for part in path[:-1]:
        target = target.setdefault(part, {})
    target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "largest", "refused"), BOUNDS, ids=[".".join(map(str, b[0])) for b in BOUNDS]
)
def test_every_bounded_field_takes_its_bound_and_refuses_past_it_by_name(
    path: tuple[Any, ...], largest: Any, refused: Any
) -> None:
    spec = parse_job_spec(_spec_with(path, largest))
    converter = pydantic_data_converter.payload_converter
    [received] = converter.from_payloads(converter.to_payloads([spec]), [JobSpec])
    assert received == spec
    field = ".".join(map(str, path))
    with pytest.raises(JobSpecError, match=rf"^invalid job spec: {field}: "):
        parse_job_spec(_spec_with(path, refused))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    "path",
    [("provisioning_timeout_seconds",), ("max_hourly_cost",), ("resources", "min_memory_gb")],
)
def test_nan_and_infinity_are_refused_by_name(path: tuple[str, ...], value: float) -> None:
    with pytest.raises(JobSpecError, match=rf"^invalid job spec: {'.'.join(path)}: "):
        parse_job_spec(_spec_with(path, value))


def test_a_spec_file_past_the_size_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("name: job1\n" + "#" * MAX_SPEC_FILE_BYTES + "\n")
    with pytest.raises(JobSpecError, match=r"^cannot read job spec .*: larger than 1024 KiB$"):
        load_job_spec(path)


# ---------------------------------------------------------------------------- load_job_spec


@PROPERTY
@given(data=st.one_of(hostile_specs, json_like(), valid_specs), suffix=SUFFIXES)
def test_load_serialized_documents(spec_dir: Path, data: Any, suffix: str) -> None:
    path = spec_dir / f"spec{suffix}"
    path.write_text(serialize(data, suffix), encoding="utf-8")
    loaded = check_load(path)
    if loaded is not None and _finite(data) and isinstance(data, dict):
        # What the file says is what the dict says (TOML cannot say None: it is left out).
        expected = without_none(data) if suffix == ".toml" else data
        assert loaded == parse_job_spec(expected)


@PROPERTY
@given(data=valid_specs, suffix=SUFFIXES, cut=st.floats(0, 1))
def test_load_valid_and_truncated_files(spec_dir: Path, data: Any, suffix: str, cut: float) -> None:
    text = serialize(data, suffix)
    path = spec_dir / f"spec{suffix}"
    path.write_text(text, encoding="utf-8")
    assert load_job_spec(path) == parse_job_spec(without_none(data) if suffix == ".toml" else data)
    path.write_text(text[: int(len(text) * cut)], encoding="utf-8")
    check_load(path)


@PROPERTY
@given(content=st.binary(max_size=2_000), suffix=SUFFIXES | st.just(".txt"))
def test_load_arbitrary_bytes(spec_dir: Path, content: bytes, suffix: str) -> None:
    path = spec_dir / f"bytes{suffix}"
    path.write_bytes(content)
    check_load(path)


@PROPERTY
@given(
    data=valid_specs,
    suffix=SUFFIXES,
    where=st.floats(0, 1),
    junk=st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"]),
)
def test_load_invalid_utf8_is_a_job_spec_error(
    spec_dir: Path, data: Any, suffix: str, where: float, junk: bytes
) -> None:
    raw = serialize(data, suffix).encode()
    at = int(len(raw) * where)
    path = spec_dir / f"latin{suffix}"
    path.write_bytes(raw[:at] + junk + raw[at:])
    with pytest.raises(JobSpecError) as raised:
        load_job_spec(path)
    if locale.getpreferredencoding(False).lower().replace("-", "") == "utf8":
        assert "is not UTF-8 text" in str(raised.value)


def test_a_missing_file_is_a_job_spec_error(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match="cannot read job spec"):
        load_job_spec(tmp_path / "absent.yaml")
    with pytest.raises(JobSpecError, match="cannot read job spec"):
        load_job_spec(tmp_path)  # a directory


def _bomb(levels: int = 9, width: int = 9) -> str:
    """The billion-laughs YAML: each anchor lists the previous one `width` times, so the last
    one stands for width**levels strings (9**9 = 387,420,489) in a few hundred bytes."""
    lines = ["l0: &l0 [" + ", ".join(['"lol"'] * width) + "]"]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param("name: job1\n", id="extra-keys"),
        pytest.param("name: *l8\n", id="as-name"),
        pytest.param("name: job1\nplacement: {providers: *l8, regions: *l8}\n", id="as-lists"),
        pytest.param("name: job1\nresources: *l8\n", id="as-section"),
        pytest.param("name: job1\nnodes: *l8\nmax_hourly_cost: *l8\n", id="as-numbers"),
        pytest.param("", id="bomb-only"),
    ],
)
def test_a_yaml_alias_bomb_fails_fast(tmp_path: Path, tail: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb() + tail)
    started = time.monotonic()
    with pytest.raises(JobSpecError) as raised:
        load_job_spec(path)
    assert time.monotonic() - started < 2.0
    assert len(str(raised.value)) < 5_000  # the message does not expand the aliases


def test_a_self_referencing_yaml_document_errors_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("&spec {name: job1, resources: *spec, placement: {regions: *spec}}\n")
    with pytest.raises(JobSpecError, match="resources"):
        load_job_spec(path)


def _nested(suffix: str, depth: int) -> str:
    if suffix == ".json":
        return '{"name": "job1", "resources": ' + "[" * depth + "]" * depth + "}"
    if suffix == ".toml":
        return 'name = "job1"\nresources = ' + "[" * depth + "]" * depth + "\n"
    return "name: job1\nresources: " + "[" * depth + "]" * depth + "\n"


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".toml"])
def test_moderately_nested_documents_error_cleanly(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"nested{suffix}"
    path.write_text(_nested(suffix, SHALLOW))
    with pytest.raises(JobSpecError, match="resources"):
        load_job_spec(path)


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".toml"])
def test_a_deeply_nested_document_is_a_job_spec_error(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"deep{suffix}"
    path.write_text(_nested(suffix, DEEP))
    started = time.monotonic()
    with pytest.raises(JobSpecError):
        load_job_spec(path)
    assert time.monotonic() - started < 5.0


def test_the_largest_integer_python_reads_is_a_clean_error(tmp_path: Path) -> None:
    for suffix, text in [
        (".json", f'{{"name": "job1", "nodes": {SAFE_BIG_INT}}}'),
        (".yaml", f"name: job1\nnodes: {SAFE_BIG_INT}\n"),
        (".toml", f'name = "job1"\nnodes = {SAFE_BIG_INT}\n'),
    ]:
        path = tmp_path / f"big{suffix}"
        path.write_text(text)
        with pytest.raises(JobSpecError, match="^invalid job spec: nodes: "):
            load_job_spec(path)


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".json", f'{{"name": "job1", "nodes": {BIG_INT_DIGITS}}}'),
        (".yaml", f"name: job1\nnodes: {BIG_INT_DIGITS}\n"),
        (".toml", f'name = "job1"\nnodes = {BIG_INT_DIGITS}\n'),
    ],
)
def test_an_integer_over_pythons_digit_limit_is_a_job_spec_error(
    tmp_path: Path, suffix: str, text: str
) -> None:
    path = tmp_path / f"big{suffix}"
    path.write_text(text)
    try:
        load_job_spec(path)
    except JobSpecError:
        return
    pytest.fail("a 5000-digit node count was accepted")


# ---------------------------------------------------------------------------- load_settings

PORTS = st.integers(1, 65535)
HOSTS = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True)
valid_settings = st.fixed_dictionaries(
    {},
    optional={
        "temporal": st.fixed_dictionaries(
            {},
            optional={
                "address": st.builds("{}:{}".format, HOSTS, PORTS),
                "namespace": st.text(min_size=1, max_size=20),
                "ui_port": PORTS,
            },
        ),
        "database": st.fixed_dictionaries(
            {},
            optional={
                "url": st.builds("sqlite:///{}.db".format, HOSTS)
                | st.builds("postgresql://u:p@{}:{}/db".format, HOSTS, PORTS)
            },
        ),
        "api": st.fixed_dictionaries(
            {}, optional={"host": st.text(min_size=1, max_size=20), "port": PORTS}
        ),
        "jobs": st.fixed_dictionaries(
            {},
            optional={
                "block_ttl_seconds": st.integers(1, MAX_TTL_SECONDS),
                "join_token_ttl_seconds": st.integers(1, MAX_JOIN_TOKEN_TTL_SECONDS),
            },
        ),
        "providers": st.fixed_dictionaries(
            {},
            optional={
                "fake": st.fixed_dictionaries(
                    {},
                    optional={
                        "enabled": st.booleans(),
                        "boot_delay_seconds": st.floats(0, 100),
                        "regions": st.lists(
                            st.fixed_dictionaries(
                                {"name": st.text(max_size=10)},
                                optional={"zones": st.lists(st.text(max_size=5), max_size=2)},
                            ),
                            max_size=2,
                        ),
                        "faults": st.lists(
                            st.fixed_dictionaries(
                                {"primitive": st.sampled_from(["create", "observe", "delete"])},
                                optional={"after": st.integers(0, 5), "times": st.integers(1, 5)},
                            ),
                            max_size=2,
                        ),
                    },
                )
            },
        ),
    },
)

CONFIG_ERROR_PREFIXES = ("cannot read config", "config ", "malformed config", "invalid config: ")


def check_settings(path: Path | None, env: dict[str, str]) -> Settings | None:
    try:
        loaded = load_settings(path, env=env)
    except ConfigError as error:
        message = str(error)
        from_env = any(message.startswith(f"{name}: ") for name in env)
        assert from_env or message.startswith(CONFIG_ERROR_PREFIXES), message[:500]
        if message.startswith("invalid config: "):
            assert ": " in message.removeprefix("invalid config: "), message[:500]
        return None
    assert isinstance(loaded, Settings)
    return loaded


@FEW
@given(text=st.text(max_size=500))
def test_settings_from_arbitrary_text(spec_dir: Path, text: str) -> None:
    path = spec_dir / "arbitrary.toml"
    path.write_text(text, encoding="utf-8")
    check_settings(path, env={})


@FEW
@given(content=st.binary(max_size=500))
def test_settings_from_arbitrary_bytes(spec_dir: Path, content: bytes) -> None:
    path = spec_dir / "bytes.toml"
    path.write_bytes(content)
    check_settings(path, env={})


@PROPERTY
@given(data=st.one_of(valid_settings, mutated(valid_settings)))
def test_settings_from_mutated_toml(spec_dir: Path, data: dict[str, Any]) -> None:
    path = spec_dir / "mutated.toml"
    path.write_text(to_toml(data), encoding="utf-8")
    check_settings(path, env={})


@FEW
@given(data=valid_settings)
def test_valid_settings_load(spec_dir: Path, data: dict[str, Any]) -> None:
    path = spec_dir / "valid.toml"
    path.write_text(to_toml(data), encoding="utf-8")
    assert check_settings(path, env={}) is not None


ENV_NAMES = st.sampled_from(
    [
        "GPUPROV_TEMPORAL__ADDRESS",
        "GPUPROV_TEMPORAL__UI_PORT",
        "GPUPROV_API__PORT",
        "GPUPROV_JOBS__BLOCK_TTL_SECONDS",
        "GPUPROV_PROVIDERS__FAKE__REGIONS",
        "GPUPROV_PROVIDERS__FAKE__FAULTS",
        "GPUPROV_PROVIDERS__FAKE",
        "GPUPROV_TEMPORAL__ADDRESS__HOST",
        "GPUPROV_NOPE__X",
        "GPUPROV___",
        "GPUPROV_X",
    ]
) | st.text(max_size=15).map(lambda tail: f"GPUPROV_{tail}__{tail}")
ENV_VALUES = st.text(max_size=40) | st.sampled_from(
    ["[1, 2]", '{name = "r1"}', '[{name = "r"}]', "[", "{", "true", "1e400", "-1", ""]
)


@PROPERTY
@given(env=st.dictionaries(ENV_NAMES, ENV_VALUES, max_size=4))
def test_settings_from_arbitrary_environment(env: dict[str, str]) -> None:
    check_settings(None, env=env)


@pytest.mark.parametrize(
    ("toml", "env"),
    [
        pytest.param(f"[jobs]\nblock_ttl_seconds = {BIG_INT_DIGITS}\n", {}, id="file-int"),
        pytest.param("", {"GPUPROV_API__PORT": BIG_INT_DIGITS}, id="env-int"),
        pytest.param("", {"GPUPROV_API__PORT": f"[{BIG_INT_DIGITS}]"}, id="env-array"),
    ],
)
def test_an_integer_over_pythons_digit_limit_is_a_config_error(
    tmp_path: Path, toml: str, env: dict[str, str]
) -> None:
    path = tmp_path / "gpuprov.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError):
        load_settings(path, env=env)


@pytest.mark.parametrize(
    ("toml", "env"),
    [
        pytest.param("x = " + "[" * DEEP + "]" * DEEP + "\n", {}, id="file"),
        pytest.param("", {"GPUPROV_API__HOST": "[" * DEEP + "]" * DEEP}, id="env"),
    ],
)
def test_a_deeply_nested_setting_is_a_config_error(
    tmp_path: Path, toml: str, env: dict[str, str]
) -> None:
    path = tmp_path / "gpuprov.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError):
        load_settings(path, env=env)


# ---------------------------------------------------------------------------- capabilities

valid_capabilities = st.fixed_dictionaries(
    {},
    optional={
        "gpus": st.lists(
            st.fixed_dictionaries(
                {"name": st.text(max_size=30)},
                optional={
                    "memory_mb": st.none() | st.integers(0, 10**6),
                    "driver_version": st.none() | st.text(max_size=10),
                    "uuid": st.none() | st.text(max_size=40),
                },
            ),
            max_size=4,
        ),
        "driver_version": st.none() | st.text(max_size=10),
        "cuda_version": st.none() | st.text(max_size=10),
        "cpu_count": st.none() | st.integers(0, 1024),
        "memory_gb": st.none() | st.floats(0, 1e5),
        "disk_gb": st.none() | st.floats(0, 1e6),
        "gpu_runtime_ok": st.booleans(),
        "gpu_runtime_error": st.none() | st.text(max_size=50),
        "agent_version": st.none() | st.text(max_size=10),
    },
)


def check_capabilities(data: Any) -> None:
    try:
        capabilities = WorkerCapabilities.model_validate(data)
    except ValidationError:
        return
    assert WorkerCapabilities.model_validate(capabilities.model_dump()) == capabilities
    capabilities.shape("fake", "r1")  # what placement derives from it


@PROPERTY
@given(data=json_like())
def test_capabilities_from_arbitrary_data(data: Any) -> None:
    check_capabilities(data)


@PROPERTY
@given(data=st.one_of(valid_capabilities, mutated(valid_capabilities)))
def test_capabilities_from_mutated_reports(data: dict[str, Any]) -> None:
    check_capabilities(data)


@FEW
@given(raw=st.binary(max_size=500) | json_like().map(json.dumps).map(str.encode))
def test_capabilities_from_arbitrary_json_bytes(raw: bytes) -> None:
    with contextlib.suppress(ValidationError):
        WorkerCapabilities.model_validate_json(raw)
