"""Where ROLL's base configs come from on the machine that runs `pulumi up`: a checkout the user names, else the
files of the pinned ref fetched over HTTP and cached. The fetch is exercised against a local HTTP server that
serves the snapshot the way GitHub's raw file host lays it out (<owner>/<repo>/<ref>/<path>); nothing here
reaches the network (tests/conftest.py refuses it)."""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.offline_cloud import ROLL_SNAPSHOT
from infra.config import DEFAULT_ROLL_REF, ContainerConfig, RollConfig, TrainingConfig
from infra.frameworks import ClusterShape, RollAdapter, roll_sources
from infra.frameworks.roll_sources import CheckoutExamples, FetchedExamples, RollSourceError

DEV_SHAPE = ClusterShape("dev", 1, 1, False, "", None, "/data", 8265)


def roll(**fields: object) -> RollConfig:
    return RollConfig.model_validate(fields)


class Server:
    def __init__(self, root: Path):
        self.requests: list[str] = []
        self.status: int | None = None  # force every answer to this status (e.g. 503)
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.path)
                if server.status is not None:
                    self.send_error(server.status)
                    return
                super().do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def raw_host(tmp_path: Path) -> Iterator[Server]:
    """The snapshot's files at <root>/alibaba/ROLL/<ref>/examples/..., as the raw file host has them."""
    root = tmp_path / "raw"
    shutil.copytree(ROLL_SNAPSHOT / "examples", root / "alibaba" / "ROLL" / DEFAULT_ROLL_REF / "examples")
    server = Server(root)
    yield server
    server.close()


def fetched(server: Server, cache: Path | None) -> FetchedExamples:
    return FetchedExamples(
        f"{server.url}/alibaba/ROLL/{DEFAULT_ROLL_REF}", cache, "https://github.com/alibaba/ROLL/tree/x/examples"
    )


def test_fetched_files_are_cached_per_ref_and_read_back_without_the_network(raw_host: Server, tmp_path: Path) -> None:
    cache = tmp_path / "cache" / DEFAULT_ROLL_REF
    name = "agentic_demo/agent_val_frozen_lake_single_node_demo.yaml"
    first = fetched(raw_host, cache).read(name)
    assert first == (ROLL_SNAPSHOT / "examples" / name).read_text()
    assert (cache / "examples" / name).read_text() == first
    assert raw_host.requests == [f"/alibaba/ROLL/{DEFAULT_ROLL_REF}/examples/{name}"]
    raw_host.close()  # a later `pulumi up` reads the cache, even offline
    assert fetched(raw_host, cache).read(name) == first
    assert not list(cache.rglob("*.tmp"))


def test_the_whole_roll_config_built_from_fetched_files_equals_the_one_from_a_checkout(
    raw_host: Server, tmp_path: Path
) -> None:
    training = TrainingConfig.model_validate({"framework": "roll"})
    container = ContainerConfig.model_validate({})
    from_fetch = RollAdapter(training, container, fetched(raw_host, tmp_path / "c")).job(DEV_SHAPE)
    from_checkout = RollAdapter(training, container, CheckoutExamples(ROLL_SNAPSHOT)).job(DEV_SHAPE)
    assert from_fetch.rendered_config == from_checkout.rendered_config
    assert from_fetch.job_id == from_checkout.job_id
    # The base and the file its Hydra defaults pull in, nothing else.
    assert sorted(raw_host.requests) == sorted(
        f"/alibaba/ROLL/{DEFAULT_ROLL_REF}/examples/{name}"
        for name in ("agentic_demo/agent_val_frozen_lake_single_node_demo.yaml", "config/traj_envs.yaml")
    )


def test_a_missing_file_is_none_and_the_error_points_at_the_refs_examples(raw_host: Server) -> None:
    examples = fetched(raw_host, None)
    assert examples.read("agentic_demo/nope.yaml") is None
    message = roll_sources.missing_base_message(examples, "agentic_demo/nope.yaml", DEFAULT_ROLL_REF)
    assert message.startswith("roll-cluster:training.roll.baseConfig: must name a file under ROLL's examples/")
    assert "https://github.com/alibaba/ROLL/tree/x/examples" in message


def test_a_failing_host_is_retried_then_named_with_the_fix(raw_host: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(roll_sources.time, "sleep", lambda seconds: None)
    raw_host.status = 503
    with pytest.raises(RollSourceError, match=r"HTTP 503, 3 attempts.*roll-cluster:training\.roll\.checkout"):
        fetched(raw_host, None).read("config/traj_envs.yaml")
    assert len(raw_host.requests) == roll_sources.FETCH_ATTEMPTS


def test_resolve_prefers_the_configured_checkout_then_the_environment_then_the_fetch(tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(ROLL_SNAPSHOT, other)
    env = {"ROLL_CHECKOUT": str(ROLL_SNAPSHOT), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    chosen = roll_sources.resolve(roll(checkout=str(other)), env)
    assert isinstance(chosen, CheckoutExamples) and chosen.root == other
    chosen = roll_sources.resolve(roll(), env)
    assert isinstance(chosen, CheckoutExamples) and chosen.root == ROLL_SNAPSHOT
    fetch = roll_sources.resolve(roll(), {"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert isinstance(fetch, FetchedExamples)
    assert fetch.base_url == f"https://raw.githubusercontent.com/alibaba/ROLL/{DEFAULT_ROLL_REF}"
    assert fetch.cache_dir == tmp_path / "xdg" / "roll-cluster" / "roll" / DEFAULT_ROLL_REF
    # A branch moves: its files are fetched on every run, never cached.
    branch = roll_sources.resolve(roll(ref="main"), {"HOME": str(tmp_path)})
    assert isinstance(branch, FetchedExamples) and branch.cache_dir is None


def test_a_checkout_at_another_commit_or_without_examples_is_refused_naming_the_setting(tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(ROLL_SNAPSHOT, other)
    (other / ".roll-ref").write_text("0" * 40 + "\n")
    with pytest.raises(RollSourceError, match=r"^roll-cluster:training\.roll\.checkout: the checkout at .* is at 0000"):
        roll_sources.resolve(roll(checkout=str(other)), {})
    with pytest.raises(RollSourceError, match=r"^ROLL_CHECKOUT \(environment\): must be a ROLL checkout"):
        roll_sources.resolve(roll(), {"ROLL_CHECKOUT": str(tmp_path / "empty")})
    with pytest.raises(RollSourceError, match=r"^roll-cluster:training\.roll\.checkout: required when"):
        roll_sources.resolve(roll(repo="https://git.example.com/roll.git"), {})


def test_a_git_checkout_is_asked_for_its_commit(tmp_path: Path) -> None:
    repo = tmp_path / "ROLL"
    (repo / "examples").mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert roll_sources.checkout_ref(repo) == head
    with pytest.raises(RollSourceError, match=f"is at {head}"):
        roll_sources.resolve(roll(checkout=str(repo)), {})
    assert isinstance(roll_sources.resolve(roll(checkout=str(repo), ref=head), {}), CheckoutExamples)
