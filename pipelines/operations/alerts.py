"""Deliver a nightly alert's JSON to its receivers: a webhook (HTTP POST) and/or a command
(the JSON on its standard input). A receiver that fails is reported, never raised: the
alert files are already on disk, and the next run of the night tries it again."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request

from logicrank.pipelines.config.retrieval import AlertConfig


def deliver(alert: dict, cfg: AlertConfig, skip: frozenset[str] = frozenset()) -> dict[str, str]:
    """receiver ('webhook' | 'command') -> 'ok: ...' or 'failed: ...'; receivers in ``skip`` are not called."""
    body = json.dumps(alert, indent=2).encode()
    results: dict[str, str] = {}
    if cfg.webhook and "webhook" not in skip:
        results["webhook"] = _post(cfg.webhook, body, cfg.timeout_s)
    if cfg.command and "command" not in skip:
        results["command"] = _command(list(cfg.command), body, cfg.timeout_s)
    return results


def _post(url: str, body: bytes, timeout: float) -> str:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "logicrank-nightly"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (the URL is the operator's config, http(s) only)
            return f"ok: HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"failed: HTTP {exc.code} from {url}"
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return f"failed: {url}: {getattr(exc, 'reason', exc)}"


def _command(argv: list[str], body: bytes, timeout: float) -> str:
    try:
        done = subprocess.run(argv, input=body, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed: {argv[0]}: {exc}"
    if done.returncode:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return f"failed: {argv[0]} exited {done.returncode} {tail[0]}".rstrip()
    return "ok: exit 0"
