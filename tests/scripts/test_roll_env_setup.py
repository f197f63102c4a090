"""The code step of a ROLL config that uses WebShop (infra/scripts/roll_env_setup.sh after fetch_code.sh, as
RollAdapter.code() renders it): the setup ROLL's run script does by hand, done on the node, only when needed, once
per container, with the image checked for the Java runtime WebShop's search engine needs. Run for real on a fake
node (tests/helpers/script_harness.py): git, bash and the step's own functions are real; docker, pip and spaCy's
download are stand-ins that record their calls."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from script_harness import FakeNode, assert_failed, assert_ok

from devtools.offline_cloud import ROLL_SNAPSHOT
from infra.config import ContainerConfig, TrainingConfig
from infra.frameworks import roll_sources
from infra.frameworks.roll import RollAdapter

WEBSHOP = "qwen2.5-7B-agentic_megatron/agentic_val_webshop.yaml"
INDEX = "-i https://mirrors.aliyun.com/pypi/simple/"


def git_repo(work: Path, files: dict[str, str]) -> tuple[str, str]:
    """A bare repository with one commit holding `files`; (its path, the commit)."""
    work.mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(work), *args], check=True, capture_output=True, text=True,
                              env=env).stdout.strip()

    git("init", "-q")
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    git("add", ".")
    git("commit", "-q", "-m", "one")
    git("tag", "v1")
    bare = work.with_suffix(".git")
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(bare), "config", "uploadpack.allowAnySHA1InWant", "true"], check=True)
    return str(bare), git("rev-parse", "HEAD")


def java_home(tmp_path: Path) -> str:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\nexit 0\n")
    (home / "bin" / "java").chmod(0o755)
    return str(home)


def webshop_step(node: FakeNode, roll_repo: str, **overrides: str) -> tuple[list[str], dict[str, str]]:
    """The scripts and environment the program gives the code step for the WebShop example, as is, except what
    cannot exist here: the GitHub repositories (local ones) and /workspace (a directory of the fake node)."""
    training = TrainingConfig.model_validate({"framework": "roll", "roll": {"pipeline": "agentic",
                                                                           "baseConfig": WEBSHOP}})
    code = RollAdapter(training, ContainerConfig(), roll_sources.CheckoutExamples(ROLL_SNAPSHOT)).code()
    env = code.env("roll")
    settings = {**env, "CODE_REPO": roll_repo, "CODE_REF": "v1", "CODE_ARCHIVE_URL": "",
                "CODE_DIR": str(node.root / "container" / env["CODE_DIR"].lstrip("/")), "WEBSHOP_ARCHIVE_URL": "",
                **overrides}
    return list(code.scripts), settings


@pytest.fixture
def running(node: FakeNode) -> FakeNode:
    node.set_state("docker/containers/roll", "true")
    return node


def test_a_checkout_with_the_submodule_gets_its_requirements_and_the_spacy_model_once(
    running: FakeNode, tmp_path: Path
) -> None:
    # What a git checkout holds after fetch_code.sh's `git submodule update --init`: the submodule's files.
    roll, _ = git_repo(tmp_path / "ROLL", {
        "requirements_torch260_vllm.txt": "ray\n",
        "third_party/webshop-minimal/requirements.txt": "pyserini\nspacy\n",
    })
    scripts, settings = webshop_step(running, roll, JAVA_HOME=java_home(tmp_path))
    assert scripts == ["fetch_code.sh", "roll_env_setup.sh"]
    code_dir = settings["CODE_DIR"]

    first = running.run_step("code", scripts, **settings)

    assert_ok(first)
    assert "verified: the container has a Java runtime for WebShop's search engine" in first.stdout
    assert f"verified: {code_dir}/third_party/webshop-minimal holds webshop-minimal" in first.stdout
    assert running.calls("pip")[-1] == (
        f"cwd={code_dir} install --progress-bar off {INDEX} -r third_party/webshop-minimal/requirements.txt"
    )
    # `--` ends spaCy's options before the model's name (click, which spaCy's CLI is built on).
    assert running.calls("spacy") == [f"cwd={code_dir} download -- en_core_web_sm"]

    pip_calls = len(running.calls("pip"))
    second = running.run_step("code", scripts, **settings)

    assert_ok(second)
    assert "WebShop's requirements and spaCy's en_core_web_sm already installed in this container; skipped" in (
        second.stdout
    )
    assert len(running.calls("pip")) == pip_calls and len(running.calls("spacy")) == 1


def test_a_checkout_without_the_submodule_gets_its_pinned_commit(running: FakeNode, tmp_path: Path) -> None:
    # ROLL's archive (GitHub's tarball) leaves the submodule out: its pinned commit is fetched into its folder.
    roll, _ = git_repo(tmp_path / "ROLL", {"requirements_torch260_vllm.txt": "ray\n"})
    webshop, commit = git_repo(tmp_path / "webshop-minimal", {"requirements.txt": "pyserini\n"})
    scripts, settings = webshop_step(running, roll, JAVA_HOME=java_home(tmp_path), WEBSHOP_REPO=webshop,
                                     WEBSHOP_COMMIT=commit)

    result = running.run_step("code", scripts, **settings)

    assert_ok(result)
    folder = Path(settings["CODE_DIR"]) / "third_party" / "webshop-minimal"
    assert (folder / "requirements.txt").read_text() == "pyserini\n"
    head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert head.stdout.strip() == commit
    assert f"checked out {webshop}@{commit} in {folder}" in result.stdout


def test_an_image_without_java_stops_the_step_naming_the_image_before_any_webshop_install(
    running: FakeNode, tmp_path: Path
) -> None:
    roll, _ = git_repo(tmp_path / "ROLL", {
        "requirements_torch260_vllm.txt": "ray\n",
        "third_party/webshop-minimal/requirements.txt": "pyserini\n",
    })
    # The image's name travels as data: a command substitution in it is printed, never run.
    pwned = tmp_path / "pwned"
    image = f"registry.example/roll:$(touch {pwned})"
    scripts, settings = webshop_step(running, roll, JAVA_HOME=str(tmp_path / "no-jdk"), WEBSHOP_IMAGE=image)

    result = running.run_step("code", scripts, **settings)

    assert_failed(result, f"roll-cluster:container.image {image} has no Java runtime")
    assert not any("webshop-minimal" in call for call in running.calls("pip"))
    assert running.calls("spacy") == []
    assert not pwned.exists()
