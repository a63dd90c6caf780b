"""The node agent: probe this machine's GPUs, register it with the control plane, keep it alive.

    python3 agent.pyz probe [--disk-path /data]          print the capabilities JSON
    python3 agent.pyz register --url URL < token-file    probe, then POST /v1/workers/register
    python3 agent.pyz run [--url URL] [--token-file F]   register once, then heartbeat until revoked
    python3 agent.pyz whoami --url URL                   what the API knows of this worker
    python3 agent.pyz supervise DIR                      (started by `run`) leads a job's work

`run` is the daemon (a systemd service on a node): without a credential in its state dir it
registers first (the join token as `register` reads it, never from argv or the environment);
then it heartbeats (POST /v1/workers/heartbeat) at the interval the API answers, each with a
fresh verdict: the registration probe, the GPUs registered that nvidia-smi no longer lists, and
what `nvidia-smi -q` says of lost GPUs and uncorrectable memory errors (`query_findings`).
Connection errors, 5xx and 429 are retried with backoff for as long as it takes (never sooner
than the answer's Retry-After): an API outage, or the API throttling this address, never stops
it. A refused credential (401: the worker was removed, or its machine released) stops it with
exit 0 and one log line, once any work still running is stopped.

Beside the heartbeats, `run` runs the node's part of a job (`WorkRunner`, a thread): it reads
its assignment (GET /v1/work, every few seconds while the worker is reserved or busy, at once
when a heartbeat's answer names one), keeps it in <state dir>/work/<id>/ (0600 files in a 0700
directory) before it reports the start (POST .../started; a refusal means it never starts),
then starts `agent.pyz supervise` in a session of its own: the leader of the work's process
group, which runs `setup` then `run` with `/bin/sh -c`, their output appended to files beside
the assignment, and writes the exit status last. The supervisor first moves into the work's
cgroup: a cgroup v2 directory gpuprov-<id> the agent makes under its own (the systemd unit's,
with Delegate=yes), where it can. The environment is the agent's own basics (PATH, HOME, the
locale, ...; never its credential or a token) plus the assignment's env and the work's mark,
GPUPROV_WORK_ID=<id>. The output goes to the API in chunks (POST .../logs, at most 32 KiB a
chunk, every second; each chunk is recorded before it is sent, so a resend after a restart
repeats its seq and the API keeps one); the end (POST .../exit: the code, negative for a
signal, and the last lines) once all of it is through. The work's end is its main process's
(the supervisor's): whatever it leaves running is killed then, before the end is reported and
its directory removed, in whatever session or process group it moved to (`setsid`, a double
fork): the process group, everything in its cgroup (frozen, then cgroup.kill) and every process
whose environment carries its mark, round after round until none is left. Where no cgroup can
be made (cgroup v1 alone, a read-only cgroup filesystem, a cgroup not delegated to the agent's
user) the group and the mark find them, and a process that drops the mark from its environment
and leaves the group escapes. A stop (the heartbeat's answer, or the assignment read again) is
SIGTERM to the process group, the grace period the assignment names, then SIGKILL to all of
the work. A restarted agent finds the work in its state dir and follows it again (it outlives
the agent: its own session and cgroup, and the systemd unit's KillMode=process), never starting
it twice; a report the control plane does not take is retried until it does, and the work goes
on meanwhile. The work runs as the agent's user: the directory keeps other users out, not the
work itself.

Registration exchanges the join token for this worker's credential, which the agent keeps in
<state dir>/worker-credential (mode 0600, in a 0700 directory): never on a command line, in
the environment, on stdout or in a log. Beside it, <state dir>/worker.json (no secret) keeps
the API's URL, the worker id and the UUIDs of the GPUs it registered with. `--state-dir`
defaults to the directory agent.pyz was installed in (bootstrap's private per-VM directory),
or ~/.gpuprov/worker when it runs from the gpuprov package (`python -m gpuprov.node`). Every
later call presents the credential (`Authorization: Bearer`). Over HTTPS, `--ca-file` pins the
CA that signed the API's certificate (default: the system's CAs); a certificate that does not
verify is refused at once, not retried.

The join token is never on a command line (`ps` shows argv to every user; shells keep history):
stdin (a pipe or file: its first line; a terminal: a prompt without echo), `--token-fd N`, or
`--token-file FILE` (mode 0600: the bare token, or an env file whose GPUPROV_JOIN_TOKEN= is the
token and GPUPROV_API_URL= stands in for --url; `--delete-token-file` removes it once read).
$GPUPROV_JOIN_TOKEN still works, with a warning (`ps e` and /proc/PID/environ show it to the user
and root); it is dropped from the environment at once, so no child inherits it. Never logged.

Probe -> gpuprov.models.WorkerCapabilities (keep them in step): gpus and driver_version from
`nvidia-smi --query-gpu=name,memory.total,driver_version,uuid --format=csv,noheader,nounits`;
cuda_version from `nvidia-smi --version` ("CUDA Version : 12.4"), else the banner ("CUDA Version:
12.4", "CUDA UMD Version: 13.3" from driver 610); cpu_count os.cpu_count(); memory_gb MemTotal of
/proc/meminfo; disk_gb shutil.disk_usage(--disk-path).total (GiB). gpu_runtime_ok is True only
for the verdict `ok`; otherwise gpu_runtime_error says why, in nvidia-smi's or CUDA's own words:
  ok                  GPUs listed, and cuInit(0) through libcuda.so.1 succeeds (in a child
                      process; a libcuda that cannot be loaded skips that check)
  no_gpu              nvidia-smi lists no GPU ("No devices were found", exit 6)
  driver_mismatch     "Failed to initialize NVML: Driver/library version mismatch" (exit 18), or
                      CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
  nvidia_smi_failed   anything else: driver not loaded (exit 9), no libnvidia-ml (exit 12), a GPU
                      fallen off the bus, a hung driver (timeout), unparsable output
  nvidia_smi_missing  no nvidia-smi on PATH
  cuda_init_failed    nvidia-smi is fine but cuInit fails or hangs (802 "system not yet
                      initialized": an NVSwitch box whose nvidia-fabricmanager is not running)
Every nvidia-smi call and the CUDA check run under a timeout: a wedged driver hangs them.

Heartbeat findings from `nvidia-smi -q` (per GPU section; "N/A" fields say nothing), each named
by the Xid the driver logs for it:
  lost                "Unable to determine the device handle ... GPU is lost" or "fallen off
                      the bus" (Xid 79), the GPU's section missing with it
  uncorrectable ECC   ECC Errors > Volatile: any "... Uncorrectable ..." count, or "Double Bit"
                      > "Total" on older drivers, above 0 since the driver loaded (Xid 48)
  needs a reset       Remapped Rows > Pending or Remapping Failure Occurred; Retired Pages >
                      Pending Page Blacklist; GPU Reset Status > Reset Required / Drain and
                      Reset Recommended; a GPU Recovery Action other than None

Standard library only, Python 3.8+, and nothing imported from outside gpuprov.node: the agent
ships to every node as one zipapp, agent.pyz, built deterministically from this package
(providers/agent_artifact.py) and checked against its pinned SHA-256 before it runs, on every
delivery path (cloud-init, the SSH bootstrap, `gpuprov join`, the fake cloud's nodes). The
system python3 of a bare Ubuntu image runs it: `python3 -I -S agent.pyz COMMAND`.
tests/gpuprov/test_agent.py enforces this.

One module a job:
  cli.py          the command line (`python -m gpuprov.node`, agent.pyz's entry point)
  smi.py          nvidia-smi and the CUDA check, run under timeouts and read
  probe.py        the registration probe: the GPU runtime's verdict and the machine's size
  health.py       a heartbeat's verdict: the probe again and `nvidia-smi -q`'s findings
  http_client.py  the calls to the control plane, retried; `register`
  credentials.py  the state dir: the worker credential and the node record
  join_token.py   reading the join token (never from argv)
  heartbeat.py    `run`: register once, then heartbeat, the work runner beside it
  work_runner.py  the node's part of a job: start, ship output, report the end
  work.py         one work: its supervisor, stop, outcome and output chunks
  workdir.py      the files of a work's directory
  processes.py    a work's cgroup, environment and `sweep`
  supervisor.py   `supervise`: the leader of a work's process group
  location.py     where the agent runs from, and how it starts itself again
  fetch.py        the pinned download of agent.pyz a node runs before the agent (the unit's
                  ExecStartPre): fetched, checked against its SHA-256, or refused
"""
