"""Ray failing to start or to let this client in: one line with the fix, not a traceback
(before: 139 lines for a local start that timed out on a loaded machine; 204 for a cluster
started with token authentication, the cause only in a warning repeated each second).

``ray.init`` is replaced by one that raises what Ray 2.60 raises (the messages are Ray's own:
ray/_private/node.py, ray/_private/authentication/authentication_token_setup.py, and gRPC's
UNAUTHENTICATED status in the GCS client's last error); nothing else of Ray is touched."""

from __future__ import annotations

import pytest
import ray
from typer.testing import CliRunner

from logicrank.cli import app
from logicrank.jobs.raysession import LOCAL_START_ATTEMPTS, RayAuthError, RayStartTimeout, ray_session
from logicrank.pipelines.config.settings import RayConfig

# ray/_private/node.py, after 30 s without the raylet registering
TIMED_OUT = ("The current node timed out during startup. This could happen because some of the raylet failed to startup or the GCS "
             "has become overloaded.")
# ray.init(address=...) with no token against a cluster that wants one: the GCS client's last error, then ray.init's ConnectionError
UNAUTHENTICATED = ("Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
                   '  File "python/ray/_raylet.pyx", line 3021, in ray._raylet.GcsClient.__init__\n'
                   "ray.exceptions.RpcError: UNAUTHENTICATED: InvalidAuthToken: Authentication token is missing or incorrect\n")


def _connect_error() -> ConnectionError:
    try:
        try:
            raise RuntimeError(UNAUTHENTICATED)
        except RuntimeError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379") from inner
    except ConnectionError as exc:
        return exc


@pytest.fixture
def ray_init(monkeypatch):
    """``ray.init`` raising what the test sets; records the clean-up (``ray.shutdown``)."""
    state = {"raise": None, "shutdowns": 0, "inits": 0, "fail_first": None}

    def init(*args, **kwargs):
        state["inits"] += 1
        if state["fail_first"] is None or state["inits"] <= state["fail_first"]:
            raise state["raise"]

    def shutdown():
        state["shutdowns"] += 1

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", shutdown)
    return state


def test_a_local_start_that_timed_out_is_one_line(ray_init):
    ray_init["raise"] = Exception(TIMED_OUT)
    with pytest.raises(RayStartTimeout) as stopped, ray_session(RayConfig()):
        pass
    assert str(stopped.value) == (
        f"ray: the local Ray cluster did not start in time ({TIMED_OUT}): the machine is too busy for Ray to start its processes "
        "within its own wait. Rerun when the machine is less loaded, or start Ray once beforehand (ray start --head --num-cpus N) "
        "and pass --ray-address auto.")
    assert ray_init["inits"] == LOCAL_START_ATTEMPTS == 3 and ray_init["shutdowns"] == 3  # each half-made start is let go


def test_a_local_start_that_timed_out_once_is_started_again(ray_init, capsys):
    ray_init["raise"], ray_init["fail_first"] = Exception(TIMED_OUT), 1
    with ray_session(RayConfig()):
        assert ray_init["inits"] == 2 and ray_init["shutdowns"] == 1
    assert ray_init["shutdowns"] == 2  # the cluster it started is shut down on exit
    assert capsys.readouterr().err == ("ray: the local Ray cluster did not start within Ray's own wait (try 1 of 3); starting it "
                                       "again\n")


def test_a_refused_or_joined_cluster_is_not_tried_again(ray_init):
    ray_init["raise"] = _connect_error()
    with pytest.raises(RayAuthError), ray_session(RayConfig(address="10.0.0.5:6379")):
        pass
    ray_init["raise"] = Exception(TIMED_OUT)  # a cluster joined by address: its start is not this job's
    with pytest.raises(Exception, match="timed out during startup"), ray_session(RayConfig(address="10.0.0.5:6379")):
        pass
    assert ray_init["inits"] == 2


def test_a_cluster_refusing_the_clients_token_is_one_line(ray_init):
    ray_init["raise"] = _connect_error()
    with pytest.raises(RayAuthError) as refused, ray_session(RayConfig(address="10.0.0.5:6379")):
        pass
    assert str(refused.value) == (
        "ray: the Ray cluster at 10.0.0.5:6379 refused this client's authentication (ray.exceptions.RpcError: UNAUTHENTICATED: "
        "InvalidAuthToken: Authentication token is missing or incorrect): it runs with token authentication. Set RAY_AUTH_MODE=token "
        "and the cluster's token where this job runs (RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH naming a file holding it, or "
        "~/.ray/auth_token; `ray get-auth-token` on the head node prints it), then rerun.")


def test_token_mode_without_a_token_is_one_line(ray_init):
    from ray._private.authentication.authentication_token_setup import TOKEN_AUTH_ENABLED_BUT_NO_TOKEN_FOUND_ERROR_MESSAGE
    from ray.exceptions import AuthenticationError

    ray_init["raise"] = AuthenticationError(TOKEN_AUTH_ENABLED_BUT_NO_TOKEN_FOUND_ERROR_MESSAGE)
    with pytest.raises(RayAuthError) as refused, ray_session(RayConfig(address="auto")):
        pass
    assert str(refused.value).startswith(f"ray: the Ray cluster at auto refused this client's authentication "
                                         f"({TOKEN_AUTH_ENABLED_BUT_NO_TOKEN_FOUND_ERROR_MESSAGE}): it runs with token authentication. "
                                         "Set RAY_AUTH_MODE=token and the cluster's token")
    assert "\n" not in str(refused.value)


def test_other_start_failures_keep_their_traceback(ray_init):
    ray_init["raise"] = ValueError("When connecting to an existing cluster, num_cpus must not be provided.")
    with pytest.raises(ValueError, match="num_cpus must not be provided"), ray_session(RayConfig(address="auto")):
        pass
    ray_init["raise"] = ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379")  # unreachable, no auth in it
    with pytest.raises(ConnectionError), ray_session(RayConfig(address="10.0.0.5:6379")):
        pass


@pytest.mark.parametrize(("fault", "address", "code", "start"), [
    ("auth", "10.0.0.5:6379", 2, "error: ray: the Ray cluster at 10.0.0.5:6379 refused this client's authentication ("),
    ("timeout", None, 1, "error: ray: the local Ray cluster did not start in time ("),
])
def test_the_command_line_prints_one_line(ray_init, tmp_path, fault, address, code, start):
    ray_init["raise"] = _connect_error() if fault == "auth" else Exception(TIMED_OUT)
    (tmp_path / "q.jsonl").write_text('{"_id": "q1", "text": "x"}\n')
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\ta\t1\n")
    (tmp_path / "c.jsonl").write_text('{"_id": "a", "text": "x"}\n')
    args = ["--stall-timeout", "0", "index", str(tmp_path / "c.jsonl"), "--db", str(tmp_path / "db"), "--out", str(tmp_path / "r"),
            "--no-progress", *(["--ray-address", address] if address else [])]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == code, res.output
    tries = [line for line in res.stderr.splitlines() if line.endswith("starting it again")]  # a local start's, before its error
    assert len(tries) == (LOCAL_START_ATTEMPTS - 1 if fault == "timeout" else 0), res.stderr
    said = res.stderr.splitlines()[len(tries):]
    assert len(said) == 1 and said[0].startswith(start), res.stderr
    assert "Index run stopped before reading any rows" in res.stderr or "before writing any" in res.stderr
