"""A heartbeat's verdict: the registration probe again, the registered GPUs nvidia-smi no longer
lists, and what `nvidia-smi -q` says (`query_findings`: lost GPUs, uncorrectable ECC errors,
GPUs that need a reset), each finding named by the Xid the driver logs for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .probe import check_gpu_runtime
from .smi import SMI_MISSING, SMI_TIMEOUT, TimedOut, run_bounded

MAX_DETAIL = 500  # the API's limit on a heartbeat's detail


BUS_ID = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]"
QUERY_GPU = re.compile(rf"^GPU ({BUS_ID})\s*$")
LOST_HANDLE = re.compile(rf"Unable to determine the device handle for GPU\s*(?:\d+:\s*)?({BUS_ID})")
LOST_TEXT = re.compile(r"GPU is lost|fallen off the bus", re.IGNORECASE)
COUNT = re.compile(r"\d+")
YES = "Yes"
# (section, field) of `nvidia-smi -q` that say the GPU must be reset (or drained and reset).
RESET_FLAGS = (
    (("Remapped Rows", "Pending"), "row remapping pending: reset the GPU"),
    (("Remapped Rows", "Remapping Failure Occurred"), "row remapping failed"),
    (("Retired Pages", "Pending Page Blacklist"), "page retirement pending: reset the GPU"),
    (("Retired Pages", "Pending Page Retirement"), "page retirement pending: reset the GPU"),
    (("GPU Reset Status", "Reset Required"), "reset required"),
    (("GPU Reset Status", "Drain and Reset Recommended"), "drain and reset recommended"),
)


def parse_query(text: str) -> dict:
    """`nvidia-smi -q` as {bus id: {(section, ..., field): value}}, one entry per GPU section;
    nesting comes from the indentation (four spaces a level), "N/A" values are left out."""
    gpus: dict = {}
    fields: dict | None = None
    path: list = []
    for line in text.splitlines():
        header = QUERY_GPU.match(line)
        if header:
            fields = gpus.setdefault(header.group(1), {})
            path = []
            continue
        if fields is None or not line.strip():
            continue
        if not line.startswith(" "):  # back at the top level (a unit, the end)
            fields = None
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 4
        key, colon, value = line.strip().partition(":")
        path = path[: max(depth - 1, 0)]
        if not colon:
            path.append(key.strip())
            continue
        value = value.strip()
        if value and value != "N/A":
            fields[(*path, key.strip())] = value
    return gpus


def _count(value: str | None) -> int:
    match = COUNT.match(value or "")
    return int(match.group()) if match else 0


def gpu_findings(fields: dict) -> list:
    """What one GPU's `-q` section says is wrong with it (empty: nothing)."""
    uncorrectable = sum(
        _count(value)
        for path, value in fields.items()
        if path[:2] == ("ECC Errors", "Volatile")
        and ("Uncorrectable" in path[-1] or (path[-1] == "Total" and "Double Bit" in path))
    )
    problems = []
    if uncorrectable:
        problems.append(
            f"{uncorrectable} uncorrectable ECC error(s) since the driver loaded (Xid 48)"
        )
    problems += [problem for key, problem in RESET_FLAGS if fields.get(key) == YES]
    action = fields.get(("GPU Recovery Action",))
    if action and action != "None":
        problems.append(f"recovery action {action}")
    return list(dict.fromkeys(problems))


def query_findings(text: str) -> list:
    """Every problem `nvidia-smi -q` output (stdout and stderr) shows, one line each."""
    findings = []
    lost = dict.fromkeys(match.group(1) for match in LOST_HANDLE.finditer(text))
    for bus in lost:
        findings.append(f"GPU {bus} is lost (fallen off the bus, Xid 79)")
    if not lost and LOST_TEXT.search(text):
        said = next(line.strip() for line in text.splitlines() if LOST_TEXT.search(line))
        findings.append(f"a GPU is lost (Xid 79): {said[:200]}")
    for bus, fields in parse_query(text).items():
        findings += [f"GPU {bus}: {problem}" for problem in gpu_findings(fields)]
    return findings


def _query_health(timeout: float) -> list:
    """Findings of one `nvidia-smi -q`; a run that fails without a finding is one itself."""
    try:
        code, stdout, stderr = run_bounded(["nvidia-smi", "-q"], timeout)
    except TimedOut:
        return [f"nvidia-smi -q timed out after {timeout:g}s (a hung driver?)"]
    except OSError as error:
        return [f"nvidia-smi -q cannot run: {error.strerror}"]
    findings = query_findings(stdout + "\n" + stderr)
    if code != 0 and not findings:
        said = "; ".join(line.strip() for line in (stderr or stdout).splitlines() if line.strip())
        findings.append(f"nvidia-smi -q exited {code}: {said[:300] or '(no output)'}")
    return findings


@dataclass
class Health:
    """A heartbeat's verdict: healthy, or why not (in nvidia-smi's or CUDA's words)."""

    healthy: bool
    detail: str | None = None


def check_health(
    registered: list | None = None, smi_timeout: float | None = None, libcuda: str | None = None
) -> Health:
    """The registration probe, the registered GPUs (UUIDs) nvidia-smi no longer lists, and
    `nvidia-smi -q`'s findings."""
    timeout = SMI_TIMEOUT if smi_timeout is None else smi_timeout
    runtime = check_gpu_runtime(timeout, libcuda, cuda_version=False)
    problems = [] if runtime.ok else [runtime.message or runtime.verdict]
    listed = {gpu["uuid"] for gpu in runtime.gpus if gpu.get("uuid")}
    missing = [uuid for uuid in registered or () if uuid not in listed]
    if missing and (runtime.ok or runtime.gpus):  # not when nvidia-smi listed nothing at all
        shown = ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else "")
        problems.append(
            f"{len(missing)} registered GPU(s) missing from nvidia-smi's list "
            f"({len(listed)} of {len(registered or ())} listed): {shown}"
        )
    if runtime.verdict != SMI_MISSING:
        problems += _query_health(timeout)
    if not problems:
        return Health(True)
    return Health(False, "; ".join(dict.fromkeys(problems))[:MAX_DETAIL])
