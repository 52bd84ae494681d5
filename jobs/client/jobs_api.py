"""The Ray Jobs API from a laptop, bounded: every request (`bounded_client`), the submission, and
following a job's status and logs until it ends (`follow_job`, the one follow loop of `jobs.submit`
and `jobs.demo`). A dashboard that accepts a connection and then goes quiet fails with one line
naming the request and the address, never a hang.
"""

from __future__ import annotations

import functools
import io
import secrets
import sys
from collections.abc import Callable, Iterator, Sequence

from infra.config import Environment
from jobs.client.uploads import runtime_env
from jobs.runtime.deadlines import Deadline

# A job's terminal states, and the exit status `jobs.submit` gives each.
TERMINAL = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 1}
# Per-request bounds on the Jobs API. They apply to each socket operation, not to the whole request:
# connecting, and handing over each 16 KiB block of a body (CONNECT_S); the answer starting, and each
# read of it (READ_S). A slow but moving working_dir upload or log download is never cut off.
CONNECT_S = 10.0
READ_S = 30.0


class SubmitError(RuntimeError):
    """Could not submit or follow the job; the message says what to do."""


class DashboardStalled(SubmitError):
    """A Jobs API request got no progress within its bound: the dashboard accepted and went quiet."""

    def __init__(self, message: str, method: str, endpoint: str):
        super().__init__(message)
        self.method, self.endpoint = method, endpoint


class NotAuthorized(SubmitError):
    """The dashboard refused the request: no token was sent (401) or it was not the cluster's (403)."""


class JobTimedOut(TimeoutError):
    """Following a job gave up (past its timeout, or the dashboard stalled); the job was stopped if it
    could be. `logs` holds what was read before giving up."""

    def __init__(self, message: str, logs: str = ""):
        super().__init__(message)
        self.logs = logs


def _causes(err: BaseException) -> Iterator[BaseException]:
    """The error, then what it wraps (args, reason, cause, context), outermost first."""
    queue, seen = [err], set()
    while queue:
        e = queue.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        inner = [*getattr(e, "args", ()), getattr(e, "reason", None), e.__cause__, e.__context__]
        queue += [i for i in inner if isinstance(i, BaseException)]


def _stall_phase(err: BaseException) -> str | None:
    """Which socket operation a requests error timed out in ('connect', 'send', 'read'), or None when it
    is no timeout. requests reports some as ConnectionError (a stalled body send, a stalled read of the
    answer's body), so look inside."""
    import requests
    from urllib3.exceptions import ConnectTimeoutError, NewConnectionError, ReadTimeoutError

    kinds = [
        (requests.ConnectTimeout, "connect"),
        (ConnectTimeoutError, "connect"),
        (requests.ReadTimeout, "read"),
        (ReadTimeoutError, "read"),
        (TimeoutError, "send"),
    ]
    for e in _causes(err):
        if isinstance(e, NewConnectionError):
            return None  # refused or unresolvable; urllib3 2 subclasses it from ConnectTimeoutError
        for kind, phase in kinds:
            if isinstance(e, kind):
                return phase
    return None


def _stalled(address: str, method: str, endpoint: str, phase: str, bounds: tuple[float, float]) -> DashboardStalled:
    connect_s, read_s = bounds
    what = {
        "connect": f"did not accept a connection for {method} {endpoint} within {connect_s:g} s",
        "send": f"stopped taking the body of {method} {endpoint} for {connect_s:g} s",
        "read": f"did not answer {method} {endpoint} within {read_s:g} s",
    }[phase]
    return DashboardStalled(f"the Ray dashboard at {address} {what}", method, endpoint)


@functools.cache
def _bounded_client_class() -> type:
    # Built on first use: importing Ray costs seconds that `--print-credentials-command` should not pay.
    import requests
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    class BoundedJobSubmissionClient(JobSubmissionClient):
        def __init__(self, address: str, *, connect_s: float, read_s: float, **kwargs):
            self.bounds = (connect_s, read_s)  # set first: the base constructor already sends requests
            super().__init__(address, **kwargs)

        def _do_request(self, method: str, endpoint: str, *, data=None, json_data=None, **kwargs):
            kwargs.setdefault("timeout", self.bounds)
            if isinstance(data, bytes):
                # urllib3 sends a bytes body with one sendall(), whose timeout bounds the whole upload;
                # a file object goes in 16 KiB blocks, each bounded: a big working_dir still gets through.
                data = io.BytesIO(data)
            try:
                return super()._do_request(method, endpoint, data=data, json_data=json_data, **kwargs)
            except AuthenticationError as err:
                raise refused(self._address, method, endpoint, err.message) from None
            except requests.RequestException as err:
                phase = _stall_phase(err)
                if phase is None:
                    raise
                raise _stalled(self._address, method, endpoint, phase, self.bounds) from None

    return BoundedJobSubmissionClient


def refused(address: str, method: str, endpoint: str, message: str) -> NotAuthorized:
    """One line for Ray's multi-line authentication error (`format_authentication_http_error`:
    "Authentication required" for 401, "Authentication failed" for 403)."""
    why = "no token was sent (401)" if message.startswith("Authentication required") else "the token is not this cluster's (403)"
    return NotAuthorized(f"the Ray dashboard at {address} refused {method} {endpoint}: {why}")


def bounded_client(address: str, connect_s: float = CONNECT_S, read_s: float = READ_S):
    """A Ray `JobSubmissionClient` whose every request, the constructor's version checks included, raises
    DashboardStalled after `connect_s` without connecting or sending, or `read_s` without an answer."""
    return _bounded_client_class()(address, connect_s=connect_s, read_s=read_s)


def _reachable(address: str, bounds: tuple[float, float]) -> None:
    import requests

    try:
        answer = requests.get(f"{address.rstrip('/')}/api/version", timeout=bounds)
        if answer.status_code not in (401, 403):  # it answers; the client's requests carry the token
            answer.raise_for_status()
    except requests.RequestException as err:
        phase = _stall_phase(err)
        if phase is not None:
            raise _stalled(address, "GET", "/api/version", phase, bounds) from None
        raise SubmitError(f"no Ray dashboard answers at {address}: {err.__class__.__name__}; is the cluster up?") from None


def new_submission_id() -> str:
    """Ray's own form (`raysubmit_...`), chosen here so a job whose POST got no answer can still be stopped."""
    return f"raysubmit_{secrets.token_hex(8)}"


def _stop(client, job_id: str) -> str:
    """Stop the job (each request bounded by the client); say how it went, for the error line."""
    try:
        client.stop_job(job_id)
    except Exception as err:  # reported, not raised: the reason we stopped matters more
        return f"stopping it failed too ({' '.join(str(err).split()) or err.__class__.__name__}); it may still be running"
    return "it was stopped"


def submit_job(client, entrypoint: str, runtime_env: dict, submission_id: str | None = None) -> str:
    """Submit through the Jobs API; returns the job id. A POST that stalls may still have started the
    job, so it is stopped before SubmitError is raised."""
    submission_id = submission_id or new_submission_id()
    try:
        return client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env, submission_id=submission_id)
    except DashboardStalled as err:
        if (err.method, err.endpoint) != ("POST", "/api/jobs/"):
            raise  # stalled before the job could exist (version check, upload)
        raise SubmitError(f"{err}; job {submission_id} may have started anyway: {_stop(client, submission_id)}") from None


def _status_name(status) -> str:
    return str(getattr(status, "value", status))  # a JobStatus enum from Ray; a plain string from fakes


def follow_job(
    client, job_id: str, timeout_s: float, on_logs: Callable[[str], None], *, poll_s: float = 1.0, stop_on_interrupt: bool = False
) -> tuple[str, str]:
    """The one follow loop (jobs.submit and jobs.demo): poll the job's status and logs until it ends,
    handing each new piece of logs to `on_logs`; returns (status, logs). Past `timeout_s`, or when the
    dashboard stalls, the job is stopped and JobTimedOut raised. With `stop_on_interrupt`, Ctrl-C (or
    any other error) stops the job too before propagating."""
    deadline, logs = Deadline(timeout_s), ""
    try:
        while True:
            status = _status_name(client.get_job_status(job_id))
            latest = client.get_job_logs(job_id)
            if len(latest) > len(logs):
                on_logs(latest[len(logs) :])
            logs = latest
            if status in TERMINAL:
                return status, logs
            if deadline.expired():
                reason = f"job {job_id} still {status} after {timeout_s:.0f} s"
                break
            deadline.sleep(poll_s)
    except DashboardStalled as err:
        reason = f"{err} while following job {job_id}"
    except BaseException:
        if stop_on_interrupt:
            _stop(client, job_id)
        raise
    raise JobTimedOut(f"{reason}; {_stop(client, job_id)}", logs)


def follow(client, job_id: str, timeout_s: float, poll_s: float = 1.0, out=sys.stdout) -> str:
    """Print the job's logs as they grow until it ends; stop it and raise JobTimedOut (a TimeoutError)
    on timeout or when the dashboard stalls."""

    def write(text: str) -> None:
        out.write(text)
        out.flush()

    status, _ = follow_job(client, job_id, timeout_s, write, poll_s=poll_s)
    return status


def submit(
    address: str,
    entrypoint: str,
    env: Environment,
    env_vars: dict[str, str],
    timeout_s: float,
    *,
    connect_s: float = CONNECT_S,
    read_s: float = READ_S,
    job_pip: Sequence[str] = (),
) -> str:
    _reachable(address, (connect_s, read_s))
    client = bounded_client(address, connect_s, read_s)
    job_id = submit_job(client, entrypoint, runtime_env(env, env_vars, job_pip))
    print(f"submitted {job_id} to {address}: {entrypoint}", flush=True)
    return follow(client, job_id, timeout_s)
