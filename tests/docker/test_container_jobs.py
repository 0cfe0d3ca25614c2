"""Jobs in their own images (`ContainerSupervisor`), on this machine's Docker engine: they run,
park in place through the SDK, leave nothing behind, and what a tenant may not do is refused.

The test image is built from the local base (`deploy/images/build-local.sh`), with ``USER
root`` so that running as the tenant's uid is the node's doing, not the image's.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiodocker
import anyio
import pytest
from bench.compose_deployment import Images
from tests.node.helpers import (
    SYNTHETIC,
    TEST_ACCOUNT,
    EventLog,
    make_config,
    reachable_tmp,
    sdk_on_pythonpath,
)

from gfair.client import GfairClient
from gfair.core.failure import ExitFacts, FailureClass, classify
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster
from gfair.events.container_policy import ContainerPolicy
from gfair.events.jobs import JobResumed, JobStarted
from gfair.events.states import JobState
from gfair.node.container_jobs import (
    CONTAINER_ENGINE_DOWN,
    LABEL_NODE,
    ContainerOptions,
    ContainerSupervisor,
)
from gfair.node.job_limits import JobLimits
from gfair.node.job_runner import JobStartError, SupervisorConfig
from gfair.node.launch import RunSpec
from gfair.node.lifecycle import ProgressReport
from gfair.sdk.checkpoint import CheckpointStore
from gfair_services.node_executor.run_control import CANNOT_START_EXIT_CODE
from support.jobs import settled

from .conftest import unavailable

BASE = "gfair-local/python:bookworm"
PARKING_JOB = Path(__file__).parents[1] / "node" / "parking_job.py"
PIDS_MAX = 48
ALLOWED_ROOT = "/srv/gfair-allowed"


@pytest.fixture(scope="module")
def image(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # `images` first: it makes the local base (in CI, where nothing was built before).
    if shutil.which("docker") is None:
        unavailable("no docker CLI on PATH")
    if subprocess.run(["docker", "image", "inspect", BASE], capture_output=True).returncode:
        unavailable(f"no {BASE} image (deploy/images/build-local.sh makes it)")
    context = tmp_path_factory.mktemp("image")
    shutil.copy(PARKING_JOB, context / "parking_job.py")
    (context / "Dockerfile").write_text(
        f"FROM {BASE}\nUSER root\nCOPY parking_job.py /opt/jobs/parking_job.py\n"
    )
    tag = f"gfair-test/jobs:{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(context)], check=True, timeout=300)
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


@pytest.fixture
def root() -> Iterator[Path]:
    yield from reachable_tmp()


def config(root: Path) -> SupervisorConfig:
    return make_config(root, node_id=f"node-{uuid.uuid4().hex[:8]}")


def options() -> ContainerOptions:
    policy = ContainerPolicy(images=("gfair-test/",), mount_roots=(ALLOWED_ROOT,))
    return ContainerOptions(
        refusal=policy.refusal, limits=JobLimits(memory_per_gpu=1 << 30, pids_max=PIDS_MAX)
    )


def in_image(job_id: str, image: str, *argv: str, **launch: object) -> RunSpec:
    return RunSpec(
        job_id=job_id,
        argv=argv,
        gpu_indices=(1,),
        generation="v100",
        image=image,
        **launch,  # type: ignore[arg-type]
    )


async def containers_of(node_id: str) -> list[str]:
    async with aiodocker.Docker() as docker:
        found = await docker.containers.list(
            all=True, filters={"label": [f"{LABEL_NODE}={node_id}"]}
        )
    return [c.id for c in found]


async def test_a_job_in_its_image_parks_in_place_and_completes(image: str, root: Path) -> None:
    cfg = config(root)
    async with ContainerSupervisor(cfg, options()) as supervisor:
        log = EventLog(supervisor.events)
        job = await supervisor.start(
            in_image("job-c", image, "python3", "/opt/jobs/parking_job.py", "300", "0.01")
        )
        await log.first(ProgressReport, lambda p: p.steps >= 10, timeout_s=60)
        for _ in range(3):
            parked = await supervisor.suspend("job-c", timeout_s=20, park=True)
            assert parked.parked and parked.exited is None
            assert supervisor.busy_gpus() == frozenset()
            assert await supervisor.resume_in_place("job-c", timeout_s=20) is not None
            assert supervisor.busy_gpus() == {1}
        exited = await supervisor.wait("job-c")
    assert exited.completed and exited.exit_code == 0 and exited.steps == 300
    latest = CheckpointStore(job.paths.checkpoint_dir).latest()
    assert latest is not None
    # One container throughout: its state went to the host and back three times.
    assert latest.state == {"step": 300, "offloads": 3, "restores": 3}
    assert await containers_of(cfg.node_id) == []


async def test_a_job_starting_up_is_frozen_by_pausing_its_container(image: str, root: Path) -> None:
    cfg = config(root)
    cfg = dataclasses.replace(cfg, gpu_processes=lambda gpus: 0)
    async with ContainerSupervisor(cfg, options()) as supervisor:
        await supervisor.start(in_image("job-z", image, "sleep", "60"))
        frozen = await supervisor.suspend("job-z", timeout_s=5, park=True)
        assert frozen.parked and supervisor.busy_gpus() == frozenset()
        async with aiodocker.Docker() as docker:
            (found,) = await docker.containers.list(filters={"label": ["gfair.job=job-z"]})
            assert (await found.show())["State"]["Paused"]
            assert await supervisor.resume_in_place("job-z", timeout_s=5) is not None
            assert not (await found.show())["State"]["Paused"]
        assert (await supervisor.suspend("job-z", timeout_s=5, park=True)).parked
        # Let go while frozen: SIGKILL reaches a paused container, which then goes.
        let_go = await supervisor.suspend("job-z", timeout_s=5)
        assert let_go.exited is not None and let_go.escalation == "SIGKILL"
    assert await containers_of(cfg.node_id) == []


async def test_a_cancelled_job_leaves_no_container(image: str, root: Path) -> None:
    cfg = config(root)
    async with ContainerSupervisor(cfg, options()) as supervisor:
        # A job that ignores SIGTERM and leaves a daemon behind: neither outlives the kill.
        code = "import os,signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        code += "os.fork() or os.setsid(); time.sleep(600)"
        await supervisor.start(in_image("job-k", image, "python3", "-c", code))
        assert len(await containers_of(cfg.node_id)) == 1
        exited = await supervisor.kill("job-k", "cancelled")
    assert exited.signal == 9 and not exited.completed
    assert await containers_of(cfg.node_id) == []


async def test_an_image_that_does_not_exist_fails_with_the_engines_message(root: Path) -> None:
    cfg = config(root)
    async with ContainerSupervisor(cfg, options()) as supervisor:
        with pytest.raises(JobStartError, match="gfair-test/no-such-image") as refused:
            await supervisor.start(in_image("job-n", "gfair-test/no-such-image:1", "true"))
    assert "the container engine refused it" in str(refused.value)
    assert await containers_of(cfg.node_id) == []


@pytest.mark.parametrize(
    ("image_name", "mounts", "why"),
    [
        ("docker.io/library/python:3", (), "is not allowed here"),
        (None, ("/var/run/docker.sock:/var/run/docker.sock",), "may not be mounted"),
        (None, ("/:/host",), "may not be mounted"),
        (None, (f"{ALLOWED_ROOT}/../etc:/etc2",), "may not be mounted"),
    ],
)
async def test_an_image_or_mount_the_operator_does_not_allow_is_refused(
    image: str, root: Path, image_name: str | None, mounts: tuple[str, ...], why: str
) -> None:
    cfg = config(root)
    async with ContainerSupervisor(cfg, options()) as supervisor:
        launch = in_image("job-r", image_name or image, "true", mounts=mounts)
        with pytest.raises(JobStartError, match=why):
            await supervisor.start(launch)
    assert await containers_of(cfg.node_id) == []


async def test_a_root_image_runs_as_the_tenant_without_privileges(image: str, root: Path) -> None:
    cfg = config(root)
    code = (
        "import json,os\n"
        "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]\n"
        "def writes(p):\n"
        "    try: open(p, 'w').close(); return True\n"
        "    except OSError: return False\n"
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'caps': caps[0],\n"
        "  'etc': writes('/etc/gfair'), 'tmp': writes('/tmp/x'),\n"
        "  'nats': [k for k in os.environ if 'NATS' in k]}))"
    )
    async with ContainerSupervisor(cfg, options()) as supervisor:
        job = await supervisor.start(in_image("job-u", image, "python3", "-c", code))
        exited = await supervisor.wait("job-u")
    assert exited.exit_code == 0, exited.stderr_tail
    seen = json.loads(job.paths.stdout.read_text().strip().splitlines()[-1])
    expected = (TEST_ACCOUNT.uid, TEST_ACCOUNT.gid) if TEST_ACCOUNT else None
    if expected is not None:
        assert (seen["uid"], seen["gid"]) == expected
    assert seen["uid"] != 0
    assert int(seen["caps"], 16) == 0  # no capability at all
    assert not seen["etc"] and seen["tmp"]  # a read-only root, its own /tmp
    assert seen["nats"] == []


async def test_a_job_cannot_read_another_jobs_run_or_checkpoint_directory(
    image: str, root: Path
) -> None:
    cfg = config(root)
    secret = "the other job's words"
    code = (
        "import json,os,sys\n"
        "def reads(p):\n"
        "    try: return open(p).read() if os.path.isfile(p) else os.listdir(p)\n"
        "    except OSError as e: return type(e).__name__\n"
        "print(json.dumps([reads(p) for p in sys.argv[1:]]))"
    )
    async with ContainerSupervisor(cfg, options()) as supervisor:
        other = await supervisor.start(
            in_image("job-other", image, "python3", "-c", f"print({secret!r})")
        )
        assert (await supervisor.wait("job-other")).exit_code == 0
        assert secret in other.paths.stdout.read_text()  # there, on the host
        targets = (other.paths.stdout, other.paths.checkpoint_dir, other.paths.stdout.parent)
        nosy = await supervisor.start(
            in_image("job-nosy", image, "python3", "-c", code, *map(str, targets))
        )
        exited = await supervisor.wait("job-nosy")
    assert exited.exit_code == 0, exited.stderr_tail
    seen = json.loads(nosy.paths.stdout.read_text().strip().splitlines()[-1])
    # Only its own run, checkpoint and control directories are mounted: the other job's paths
    # do not exist in its container at all.
    assert seen == ["FileNotFoundError"] * 3


async def test_a_fork_bomb_is_stopped_by_the_pids_limit(image: str, root: Path) -> None:
    cfg = config(root)
    code = (
        "import os,sys,time\n"
        "n = 0\n"
        "while True:\n"
        "    try: pid = os.fork()\n"
        "    except OSError as e: print('refused after', n, flush=True); sys.exit(3)\n"
        "    if pid == 0: time.sleep(60); os._exit(0)\n"
        "    n += 1\n"
    )
    async with ContainerSupervisor(cfg, options()) as supervisor:
        job = await supervisor.start(in_image("job-b", image, "python3", "-c", code))
        exited = await supervisor.wait("job-b")
    assert exited.exit_code == 3, exited.stderr_tail
    forked = int(job.paths.stdout.read_text().split("refused after")[1].split()[0])
    assert forked < PIDS_MAX
    assert await containers_of(cfg.node_id) == []  # its sleeping children went with it


async def test_a_job_in_its_image_time_slices_on_a_cluster_beside_a_process_job(
    image: str, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One GPU, 1 s quanta: alice's job in its image and bob's process take turns; alice's
    # parks in place in its container at each slice's end and resumes there.
    sdk_on_pythonpath(monkeypatch)  # for bob's process, as the tenant's account
    options = ClusterOptions(
        cluster="v100:1x1",
        quantum_s=1.0,
        data_dir=root / "gfair",
        env={"GFAIR_JOB_IMAGES": "gfair-test/"},
    )
    steps = ("python3", "/opt/jobs/parking_job.py", "600", "0.01")
    async with (
        EmbeddedCluster(options) as cluster,
        await GfairClient.connect(cluster.nats_url, poll_interval_s=0.05) as client,
    ):
        refused = await client.submit("alice", 1, ["true"], image="docker.io/evil:1")
        assert refused.state is JobState.REJECTED
        await client.submit("alice", 1, steps, image=image, job_id="c", wait="running")
        await client.submit("bob", 1, [*SYNTHETIC, "--duration-s", "3600", "--speed-scale", "10"])
        ended = await client.wait("alice", "c", timeout_s=180)
        details = await settled(client, "alice", "c")
    assert ended is JobState.COMPLETED
    events = [e.data for e in details.events]
    resumed = [e for e in events if isinstance(e, JobResumed) and e.in_place]
    assert len(resumed) >= 3, events[-8:]
    assert len([e for e in events if isinstance(e, JobStarted)]) == 1  # one container


EXAMPLE = ("python", "/opt/example/pytorch_train.py", "--steps", "2000")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # the machine's few CPUs are shared
SAME_WEIGHTS = """
import sys, torch
a, b = (torch.load(f"/ck/{j}/{sys.argv[1]}/model.pt", weights_only=True) for j in ("t-a", "t-b"))
same = all(torch.equal(x, y) for x, y in zip(a["model"].values(), b["model"].values()))
momentum = [s["momentum_buffer"] for s in a["optimizer"]["state"].values()]
moved = [s["momentum_buffer"] for s in b["optimizer"]["state"].values()]
print("bitwise", same and all(torch.equal(x, y) for x, y in zip(momentum, moved)))
"""


async def test_the_pytorch_example_parks_ten_times_and_ends_bitwise_as_uninterrupted(
    example_image: str, root: Path
) -> None:
    cfg = config(root)
    policy = ContainerPolicy(images=("gfair-example/",), mount_roots=(str(root),))
    allowed = dataclasses.replace(options(), refusal=policy.refusal)
    async with ContainerSupervisor(cfg, allowed) as supervisor:
        log = EventLog(supervisor.events)
        await supervisor.start(in_image("t-a", example_image, *EXAMPLE, env=ONE_THREAD))
        assert (await supervisor.wait("t-a")).completed
        await supervisor.start(in_image("t-b", example_image, *EXAMPLE, env=ONE_THREAD))
        parks = 0
        while parks < 10:
            mark = log.mark()
            await log.first(ProgressReport, lambda p: p.job_id == "t-b", after=mark, timeout_s=60)
            parked = await supervisor.suspend("t-b", timeout_s=20, park=True)
            if parked.exited is not None:
                break  # it finished first
            assert parked.parked
            parks += 1
            assert await supervisor.resume_in_place("t-b", timeout_s=20) is not None
        assert (await supervisor.wait("t-b")).completed
        assert parks == 10
        latest = CheckpointStore(cfg.checkpoint_root / "t-a").latest()
        assert latest is not None
        check = in_image(
            "t-c",
            example_image,
            *("python", "-c", SAME_WEIGHTS, latest.path.name),
            mounts=(f"{cfg.checkpoint_root}:/ck:ro",),
        )
        job = await supervisor.start(check)
        assert (await supervisor.wait("t-c")).exit_code == 0
    assert "bitwise True" in job.paths.stdout.read_text()


async def test_an_engine_that_is_down_is_the_nodes_fault(root: Path) -> None:
    down = dataclasses.replace(options(), engine_url=f"unix://{root}/no-engine.sock")
    async with ContainerSupervisor(config(root), down) as supervisor:
        with pytest.raises(JobStartError) as refused:
            await supervisor.start(in_image("job-d", "gfair-test/any:1", "true"))
    assert CONTAINER_ENGINE_DOWN in str(refused.value)
    facts = ExitFacts(exit_code=CANNOT_START_EXIT_CODE, stderr_tail=str(refused.value))
    assert classify(facts).kind is FailureClass.INFRASTRUCTURE  # it runs elsewhere


async def test_a_gang_part_across_servers_meets_its_peers_in_the_hosts_network(
    image: str, root: Path
) -> None:
    peers = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511", "NODE_RANK": "0", "NNODES": "2"}
    # Rank 0 listens where its peers look: the host's address, not the engine's bridge.
    code = (
        "import os,socket\n"
        "s = socket.create_server(('0.0.0.0', int(os.environ['MASTER_PORT'])))\n"
        "print('rank', os.environ['NODE_RANK'], 'of', os.environ['NNODES'], flush=True)\n"
        "s.accept()[0].close()\n"
    )
    async with ContainerSupervisor(config(root), options()) as supervisor:
        job = await supervisor.start(in_image("job-g", image, "python3", "-c", code, env=peers))
        with anyio.fail_after(30):
            while True:  # the peer's side: rank 0's port on this host
                try:
                    stream = await anyio.connect_tcp("127.0.0.1", 29511)
                    break
                except OSError:
                    await anyio.sleep(0.1)
        await stream.aclose()
        exited = await supervisor.wait("job-g")
    assert exited.exit_code == 0, exited.stderr_tail
    assert "rank 0 of 2" in job.paths.stdout.read_text()


async def test_a_job_checkpoints_and_exits_its_container_then_resumes_on_another_node(
    image: str, root: Path
) -> None:
    first = config(root)
    second = dataclasses.replace(config(root), run_root=root / "runs-b")
    steps = ("python3", "/opt/jobs/parking_job.py", "400", "0.01")
    async with ContainerSupervisor(first, options()) as supervisor:
        log = EventLog(supervisor.events)
        await supervisor.start(in_image("job-m", image, *steps))
        await log.first(ProgressReport, lambda p: p.steps >= 20, timeout_s=60)
        left = await supervisor.suspend("job-m", timeout_s=20)
    assert left.fresh and left.exited is not None and left.exited.yielded
    assert left.escalation is None  # it checkpointed when asked, through the SDK
    assert left.checkpoint is not None and 20 <= left.checkpoint.step < 400
    assert await containers_of(first.node_id) == []
    async with ContainerSupervisor(second, options()) as supervisor:
        await supervisor.start(in_image("job-m", image, *steps))
        exited = await supervisor.wait("job-m")
    assert exited.completed and exited.steps == 400
    latest = CheckpointStore(second.checkpoint_root / "job-m").latest()
    assert latest is not None and latest.state["step"] == 400
