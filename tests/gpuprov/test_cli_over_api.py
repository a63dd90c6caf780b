"""`gpuprov logs`, `cost`, `workers` and `orphans` over the real control-plane API (uvicorn on a
free port, on SQLite and PostgreSQL) holding only the API's URL and an operator key: they answer
what the database holds and never open it; a wrong key is the API's 401 line, an unreachable
API one clear line. Without a key: the embedded default's database is found from any
directory, and a database behind its migrations says what to run.

The CLI runs in-process (its own event loop, on a thread), from a directory that is not the
database's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuprov.api.app import create_app, serving
from gpuprov.cli import main as cli
from gpuprov.cli.dev import free_port
from gpuprov.cli.render import cost_text
from gpuprov.store.costs import CostReport, cost_report
from gpuprov.store.credentials import Credentials
from gpuprov.store.db import Database
from gpuprov.store.liveness import Liveness
from gpuprov.store.logs import LogRecords
from gpuprov.store.records import Records
from gpuprov.store.schema import head_revision
from gpuprov.store.work import Assignment, RunCommand, WorkRecords
from tests.gpuprov.test_workers import register

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

JOB = "train"
RUN = "aaaaa1"
ORPHAN = "lost-a1-n0"
SETTINGS_ENV = (
    "GPUPROV_CONFIG",
    "GPUPROV_API_KEY",
    "GPUPROV_CLIENT__API_KEY",
    "GPUPROV_CLIENT__API_URL",
    "GPUPROV_CLIENT__CA_FILE",
    "GPUPROV_DATABASE__URL",
    "GPUPROV_TEMPORAL__DATA_DIR",
    "GPUPROV_TEMPORAL__ADDRESS",
)


def finished_job(records: Records) -> dict[str, str]:
    """Job `train` (run aaaaa1): its node's output, an hourly estimate, its machine still
    recorded; an idle worker beside it; and a machine whose termination failed."""
    vm = f"{JOB}-a1-n0-{RUN}"
    records.record_vm(
        job=JOB, node_index=0, attempt=1, vm=vm, provider="fake", region="r1", zone=None
    )
    node = register(records, "node", job=JOB)
    idle = register(records, "box-1")
    work = WorkRecords(records.db)
    work.assign(JOB, 0, [Assignment(rank=0, worker_id=node, command=RunCommand(run="true"))], RUN)
    row = work.for_worker(node)
    assert row is not None
    logs = LogRecords(records.db)
    assert logs.append(row, 0, "stdout", "hello from rank 0\n", cap=1 << 20)
    assert logs.append(row, 1, "stderr", "a warning\n", cap=1 << 20)
    records.record_cost(
        job=JOB, kind="estimate", amount=10.0, currency="USD", unit="hour", source="test",
        provider="fake", run=RUN,
    )  # fmt: skip
    records.record_orphan(
        provider="fake", region="r1", zone=None, vm=ORPHAN, instance_ids=["i-1"], error="boom"
    )
    return {"node": node, "idle": idle, "vm": vm}


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's shell: no gpuprov settings but the test's, in a directory of its own; the
    database URL it holds names a file that does not exist (and must never be created)."""
    for name in SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "user"
    home.mkdir()
    monkeypatch.chdir(home)
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "xdg"))
    monkeypatch.setenv("GPUPROV_DATABASE__URL", f"sqlite:///{tmp_path / 'nowhere' / 'none.db'}")
    monkeypatch.setenv("GPUPROV_TEMPORAL__ADDRESS", f"127.0.0.1:{free_port()}")  # nothing there
    return tmp_path / "nowhere"


@pytest.fixture
async def api_url(records: Records) -> AsyncIterator[str]:
    port = free_port()
    async with serving(create_app(records), "127.0.0.1", port):
        yield f"http://127.0.0.1:{port}"


async def gpuprov(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The CLI in this process (its own event loop, on a thread): exit code, stdout, stderr."""
    code = await asyncio.to_thread(cli.main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_the_user_commands_answer_over_the_api_without_the_database(
    records: Records,
    api_url: str,
    user: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    rows = finished_job(records)
    credentials = Credentials(records.db)
    _, member = credentials.create_operator_key("dev", role="member", team="default")
    _, admin = credentials.create_operator_key("ops")
    monkeypatch.setenv("GPUPROV_CLIENT__API_URL", api_url)
    monkeypatch.setenv("GPUPROV_CLIENT__API_KEY", member)

    code, out, err = await gpuprov(capsys, "logs", JOB)
    assert (code, out, err) == (0, "[0] hello from rank 0\n", "[0] a warning\n")
    code, out, err = await gpuprov(capsys, "logs", JOB, "--node", "1")
    # No output of rank 1: whether the job exists is Temporal's to say, and it is not reachable.
    assert (code, out) == (2, "")
    assert err.startswith(f"error: no output recorded for job {JOB!r}, and whether it exists")

    # The API scopes a member's report to its team (and adds the team's budget): what the
    # database holds of job train is all the default team's.
    expected = cost_report(records.db, JOB, RUN)
    code, out, _ = await gpuprov(capsys, "cost", JOB, "--run", RUN, "--json")
    assert code == 0
    answered = CostReport.model_validate_json(out)
    assert (answered.job, answered.run, answered.runs) == (JOB, RUN, [RUN])
    assert (answered.providers, answered.machines) == (expected.providers, expected.machines)
    for team in ([], ["--team", "default"]):
        code, out, err = await gpuprov(capsys, "cost", *team)
        assert code == 0, err
        assert "train on fake: estimate 10.00 USD/hour" in out
        code, as_json, _ = await gpuprov(capsys, "cost", *team, "--json")
        assert code == 0
        report = CostReport.model_validate_json(as_json)
        assert out == cost_text(report) + "\n"  # the text is the API's report, rendered
        assert report.providers == cost_report(records.db).providers
        assert report.team == (team[-1] if team else report.team)
        # The team's month against its budget comes first (the default team has none).
        assert out.startswith("team default: ") and "USD spent in " in out.splitlines()[0]

    # A member sees its team's jobs' workers, not the pool's idle ones.
    code, out, err = await gpuprov(capsys, "workers")
    assert code == 0, err
    assert f"{rows['node']}  managed, busy, " in out and rows["idle"] not in out

    monkeypatch.delenv("GPUPROV_CLIENT__API_KEY")
    monkeypatch.setenv("GPUPROV_API_KEY", admin)  # the plain name works too
    code, out, err = await gpuprov(capsys, "workers")
    assert code == 0, err
    assert f"{rows['node']}  managed, busy, " in out and f"{rows['idle']}  existing, idle" in out
    code, out, err = await gpuprov(capsys, "workers", "drain", rows["idle"])
    assert (code, out) == (0, f"worker {rows['idle']} draining: no new reservations\n"), err
    code, out, _ = await gpuprov(capsys, "workers", "undrain", rows["idle"])
    assert (code, out) == (0, f"worker {rows['idle']} not draining\n")
    code, out, _ = await gpuprov(capsys, "workers", "remove", rows["node"])
    assert code == 0 and f"job {JOB} is told at the next liveness sweep" in out
    assert [row.state for row in records.workers() if row.id == rows["node"]] == ["revoked"]
    code, _, err = await gpuprov(capsys, "workers", "remove", rows["node"])
    assert code == 2 and err.endswith(
        f"answered 404: no worker {rows['node']} that is not revoked\n"
    )
    assert not Liveness(records.db).set_draining(rows["node"], True)  # it stays revoked

    code, out, err = await gpuprov(capsys, "orphans")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"fake/r1 {ORPHAN} [i-1] first seen ") and "OPEN" in lines[0]
    assert lines[1] == "    last error: boom"
    assert lines[2] == "machines whose job is stuck or whose owner is unknown:"
    assert lines[3].startswith(f"job {JOB}: owner unknown: cannot reach Temporal at 127.0.0.1:")
    assert lines[4].startswith(f"    fake/r1 {rows['vm']} [no ids]: recorded (recorded ")
    records.resolve_orphan(ORPHAN)
    code, out, _ = await gpuprov(capsys, "orphans")
    assert code == 0 and out.startswith("no open orphans\n")
    code, out, _ = await gpuprov(capsys, "orphans", "--all")
    assert code == 0 and f"{ORPHAN} [i-1]" in out and ", resolved 20" in out

    monkeypatch.setenv("GPUPROV_API_KEY", member)  # orphans are every team's: admins only
    code, out, err = await gpuprov(capsys, "orphans")
    assert (code, out) == (2, "")
    assert err == (
        f"error: the API at {api_url} answered 403: this route needs the admin role; "
        "this key is a member\n"
    )
    assert not user.exists()  # the database the user's settings name was never opened


async def test_a_wrong_key_is_the_apis_401_and_an_unreachable_api_one_line(
    records: Records,
    api_url: str,
    user: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    finished_job(records)
    _, key = Credentials(records.db).create_operator_key("ops")
    wrong = key[:-1] + ("A" if key[-1] != "A" else "B")
    monkeypatch.setenv("GPUPROV_CLIENT__API_URL", api_url)
    monkeypatch.setenv("GPUPROV_CLIENT__API_KEY", wrong)
    for argv in (("logs", JOB), ("cost",), ("workers",), ("workers", "drain", "w-1"), ("orphans",)):
        code, out, err = await gpuprov(capsys, *argv)
        assert (code, out) == (2, ""), argv
        assert err == (
            f"error: the API at {api_url} answered 401: unknown or revoked operator API key\n"
        ), argv
        assert wrong not in err

    elsewhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("GPUPROV_CLIENT__API_URL", elsewhere)
    monkeypatch.setenv("GPUPROV_CLIENT__API_KEY", key)
    code, out, err = await gpuprov(capsys, "cost")
    assert (code, out) == (2, "")
    [line] = err.splitlines()
    assert line.startswith(f"error: the API at {elsewhere} cannot be reached: "), line
    assert key not in err

    monkeypatch.setenv("GPUPROV_CLIENT__API_URL", api_url)
    code, _, err = await gpuprov(capsys, "logs", JOB, "--run", "fffff9")
    assert code == 2 and err.startswith(f"error: the API at {api_url} answered 404: ")
    assert not user.exists()


# ---------------------------------------------------------------- without a key: the database


async def test_logs_from_another_directory_find_the_embedded_defaults_database(
    tmp_path: Path, user: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    monkeypatch.delenv("GPUPROV_DATABASE__URL")
    config = tmp_path / "project" / "gpuprov.toml"
    config.parent.mkdir()
    config.write_text('[temporal]\ndata_dir = "state"\n')  # relative: to the file
    for database_url, argv in (
        (f"sqlite:///{tmp_path / 'project' / 'state' / 'gpuprov.db'}", ["--config", str(config)]),
        (f"sqlite:///{Path.cwd() / 'xdg' / 'gpuprov' / 'gpuprov.db'}", []),  # no file: per user
    ):
        database = Database(database_url)
        database.upgrade()  # as `gpuprov dev` does at start
        finished_job(Records(database))
        database.dispose()
        code, out, err = await gpuprov(capsys, *argv, "logs", JOB)
        assert (code, out, err) == (0, "[0] hello from rank 0\n", "[0] a warning\n"), argv


@pytest.mark.parametrize("argv", [("logs", JOB), ("cost",), ("workers",), ("orphans",)])
async def test_a_database_behind_its_migrations_says_what_to_run(
    database_url: str,
    argv: tuple[str, ...],
    user: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
):
    Database(database_url).upgrade("0013_offer_stats")
    monkeypatch.setenv("GPUPROV_DATABASE__URL", database_url)
    code, out, err = await gpuprov(capsys, *argv)
    assert (code, out) == (2, "")
    [line] = err.splitlines()
    assert line.startswith("error: the database at ")
    assert line.endswith(
        f"is at revision 0013_offer_stats, gpuprov needs {head_revision()}: run `gpuprov setup` "
        "(it migrates the database first; `gpuprov dev` does so at start)"
    )
    assert "no such table" not in err
    database = Database(database_url)
    assert database.current_revision() == "0013_offer_stats"  # a user command migrates nothing
    database.dispose()


async def test_a_missing_or_empty_database_says_what_to_run(
    tmp_path: Path, user: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    missing = tmp_path / "none" / "gpuprov.db"
    monkeypatch.setenv("GPUPROV_DATABASE__URL", f"sqlite:///{missing}")
    code, _, err = await gpuprov(capsys, "logs", JOB)
    assert code == 2 and err.startswith(f"error: there is no database at sqlite:///{missing} (")
    assert "run `gpuprov setup`" in err and not missing.parent.exists()

    empty = tmp_path / "empty.db"
    Database(f"sqlite:///{empty}").dispose()  # the file, no tables
    monkeypatch.setenv("GPUPROV_DATABASE__URL", f"sqlite:///{empty}")
    code, _, err = await gpuprov(capsys, "workers")
    assert code == 2 and "has no gpuprov tables yet: run `gpuprov setup`" in err


async def test_submit_refuses_a_secret_the_team_cannot_see_before_the_job_starts(
    records: Records,
    api_url: str,
    user: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    _, member = Credentials(records.db).create_operator_key("dev", role="member", team="default")
    monkeypatch.setenv("GPUPROV_CLIENT__API_URL", api_url)
    monkeypatch.setenv("GPUPROV_CLIENT__API_KEY", member)
    spec = Path("job.yaml")
    spec.write_text("name: uses-secret\nrun: 'true'\nenv:\n  WANDB_API_KEY: ${{ secrets.WANDB }}\n")
    code, out, err = await gpuprov(capsys, "submit", str(spec))
    # Refused naming the variable, before Temporal (nothing listens at its address) is asked.
    assert (code, out) == (2, "")
    assert "env.WANDB_API_KEY: no secret named 'WANDB' that team 'default' can see" in err
