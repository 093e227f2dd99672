"""SLURM launchers, run for real against fake sbatch / srun / python / accelerate on PATH.

Needs ``shellcheck`` and ``dash`` (Debian/Ubuntu packages of the same names); tests that need a
missing one are skipped saying which.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SLURM_DIR = Path(__file__).resolve().parent.parent / "slurm"
MATRIX = SLURM_DIR / "run_streaming_matrix.sh"
JOB = SLURM_DIR / "_matrix_job.sh"
TRAIN = SLURM_DIR / "train_streaming_robocasa.sh"
SCRIPTS = sorted(SLURM_DIR.glob("*.sh"))
POSIX_SCRIPTS = [path for path in SCRIPTS if path.read_text().startswith("#!/bin/sh\n")]

SOURCES = ("hub", "bucket", "warmed_bucket", "local")
MODES = ("single", "sarm")
DECODES = ("cpu", "cuda")
# Settings the scripts read; cleared so that the caller's shell cannot change what is tested.
SCRIPT_ENV = ("SOURCES", "MODES", "DECODES", "NUM_WORKERS", "POOL_SIZE", "ACCOUNT", "PARTITION",
              "TIME_LIMIT", "OUTPUT_DIR", "DATASET", "SERIAL", "CONDA_ENV", "SBATCH", "GPUS_PER_NODE",
              "MASTER_PORT")


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} not found on PATH (install the '{tool}' apt package)")
    return path


def _tool(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _env(bin_dir: Path | None = None, **overrides: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in SCRIPT_ENV and not key.startswith("SLURM_")}
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env.update(overrides)
    return env


# -- lint -------------------------------------------------------------------------------------

def test_the_job_bodies_are_posix_sh():
    assert {path.name for path in POSIX_SCRIPTS} >= {JOB.name, TRAIN.name}
    for path in POSIX_SCRIPTS:
        # shellcheck reports bashisms too (SC3xxx); this one is named in the issue.
        assert not re.search(r"^\s*set .*pipefail", path.read_text(), re.MULTILINE), path.name


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_shellcheck_finds_nothing(script):
    result = subprocess.run([_need("shellcheck"), "--external-sources", script.name], cwd=SLURM_DIR,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", POSIX_SCRIPTS, ids=lambda path: path.name)
def test_dash_parses_the_posix_scripts(script):
    result = subprocess.run([_need("dash"), "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


# -- run_streaming_matrix.sh with a fake sbatch -----------------------------------------------

@pytest.fixture
def fake_sbatch(tmp_path):
    """A directory holding an ``sbatch`` that records each call's argv and replies like --parsable."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "sbatch-calls"
    bin_dir.mkdir()
    calls.mkdir()
    _tool(bin_dir, "sbatch", f"""
n=$(($(ls "{calls}" | wc -l) + 1))
printf '%s\\0' "$@" > "{calls}/call-$(printf %03d "$n")"
echo "$((1000 + n));testcluster"
""")
    return bin_dir, calls


def _submit(tmp_path, fake_sbatch, **overrides):
    bin_dir, calls = fake_sbatch
    overrides.setdefault("SBATCH", str(bin_dir / "sbatch"))
    overrides.setdefault("OUTPUT_DIR", str(tmp_path / "out"))
    result = subprocess.run(["bash", str(MATRIX)], env=_env(**overrides), capture_output=True, text=True,
                            timeout=60)
    submitted = []
    for call in sorted(calls.glob("call-*")):
        argv = call.read_bytes().decode().split("\0")[:-1]
        split = argv.index(str(JOB))
        flags, (job_dir, source, mode, decode, separator, *command) = argv[:split], argv[split + 1:]
        assert separator == "--"
        submitted.append({"flags": flags, "job_dir": job_dir, "config": (source, mode, decode),
                          "command": command, "argv": argv})
    return result, submitted


def _flag(flags, name):
    values = [flag.split("=", 1)[1] for flag in flags if flag.startswith(f"--{name}=")]
    return values[0] if values else None


def _option(command, name):
    return command[command.index(name) + 1]


def test_default_matrix_is_16_serial_isolated_jobs(tmp_path, fake_sbatch):
    result, jobs = _submit(tmp_path, fake_sbatch)
    assert result.returncode == 0, result.stderr
    assert [job["config"] for job in jobs] == list(itertools.product(SOURCES, MODES, DECODES))

    lines = [line for line in result.stdout.splitlines() if " job " in line]
    assert len(lines) == 16
    for number, (job, line) in enumerate(zip(jobs, lines), start=1):
        name = "-".join(job["config"])
        dependency = None if number == 1 else f"afterany:{1000 + number - 1}"
        assert _flag(job["flags"], "dependency") == dependency
        assert line.split() == [name, "job", str(1000 + number), "dependency", dependency or "none"]
        assert "--parsable" in job["flags"] and _flag(job["flags"], "gres") == "gpu:1"
        assert _flag(job["flags"], "job-name") == name
        assert job["job_dir"] == str(tmp_path / "out" / name) and Path(job["job_dir"]).is_dir()
        assert _flag(job["flags"], "output") == f"{job['job_dir']}/slurm-%j.out"
        assert _flag(job["flags"], "account") is None and _flag(job["flags"], "partition") is None

        command = job["command"]
        assert command[:2] == ["python", "benchmarks/streaming/benchmark_streaming.py"]
        source, mode, decode = job["config"]
        assert (_option(command, "--source"), _option(command, "--mode"), _option(command, "--decode")) == \
            job["config"]
        assert _option(command, "--output-dir") == job["job_dir"]
        assert "--dataset" not in command
        workers, pool = (4, 8) if decode == "cuda" else (8, 16)
        assert (_option(command, "--num-workers"), _option(command, "--pool-size")) == (str(workers), str(pool))
        assert _flag(job["flags"], "cpus-per-task") == str(workers + 2)

    manifest = (tmp_path / "out" / "jobs.tsv").read_text().splitlines()
    assert manifest[0].split("\t") == ["name", "job_id", "dependency"] and len(manifest) == 17


def test_overrides_parallel_conda_and_cuda_bounds(tmp_path, fake_sbatch):
    result, jobs = _submit(tmp_path, fake_sbatch, SOURCES="local,hub", MODES="sarm", DECODES="cuda cpu",
                           NUM_WORKERS="2", POOL_SIZE="32", SERIAL="0", CONDA_ENV="es-bench",
                           ACCOUNT="acct", PARTITION="gpu", TIME_LIMIT="00:10:00", DATASET="/data/robocasa")
    assert result.returncode == 0, result.stderr
    assert [job["config"] for job in jobs] == [("local", "sarm", "cuda"), ("local", "sarm", "cpu"),
                                               ("hub", "sarm", "cuda"), ("hub", "sarm", "cpu")]
    for job in jobs:
        flags, command = job["flags"], job["command"]
        assert _flag(flags, "dependency") is None
        assert (_flag(flags, "account"), _flag(flags, "partition"), _flag(flags, "time")) == \
            ("acct", "gpu", "00:10:00")
        assert command[:7] == ["conda", "run", "--no-capture-output", "-n", "es-bench", "python",
                               "benchmarks/streaming/benchmark_streaming.py"]
        assert _option(command, "--dataset") == "/data/robocasa"
        # Fewer workers than the cuda bound are kept; the pool is cut to it.
        assert _option(command, "--num-workers") == "2"
        assert _option(command, "--pool-size") == ("8" if job["config"][2] == "cuda" else "32")
    assert all(line.endswith("dependency none") for line in result.stdout.splitlines() if " job " in line)


def test_sbatch_is_found_on_path(tmp_path, fake_sbatch):
    bin_dir, _ = fake_sbatch
    result = subprocess.run(["bash", str(MATRIX)], capture_output=True, text=True, timeout=60,
                            env=_env(bin_dir, SOURCES="local", MODES="single", DECODES="cpu",
                                     OUTPUT_DIR=str(tmp_path / "out")))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:3] == ["local-single-cpu", "job", "1001"]


@pytest.mark.parametrize("variable, value, message", [
    ("SOURCES", "hub s3", "invalid SOURCES value 's3'; valid values are: hub bucket warmed_bucket local"),
    ("MODES", "both", "invalid MODES value 'both'; valid values are: single sarm"),
    ("DECODES", "gpu", "invalid DECODES value 'gpu'; valid values are: cpu cuda"),
    ("SOURCES", " , ", "SOURCES is empty"),
    ("NUM_WORKERS", "0", "NUM_WORKERS must be a positive integer, got '0'"),
    ("POOL_SIZE", "many", "POOL_SIZE must be a positive integer, got 'many'"),
    ("SERIAL", "yes", "invalid SERIAL value 'yes'; valid values are: 0 1"),
    ("CONDA_ENV", "a b", "invalid CONDA_ENV value 'a b'"),
])
def test_invalid_settings_exit_2_naming_them(tmp_path, fake_sbatch, variable, value, message):
    result, jobs = _submit(tmp_path, fake_sbatch, **{variable: value})
    assert result.returncode == 2
    assert message in result.stderr
    assert jobs == []


def test_a_submitted_job_runs_under_dash(tmp_path, fake_sbatch):
    _need("dash")
    result, jobs = _submit(tmp_path, fake_sbatch, SOURCES="local", MODES="single", DECODES="cpu")
    assert result.returncode == 0, result.stderr
    bin_dir, _ = fake_sbatch
    _tool(bin_dir, "python", 'echo "benchmark $*"\n')
    (job,) = jobs
    run = subprocess.run(["dash", *job["argv"][job["argv"].index(str(JOB)):]], env=_env(bin_dir),
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (Path(job["job_dir"]) / "status").read_text() == "ok\n"
    assert "--source local --mode single --decode cpu" in (Path(job["job_dir"]) / "job.log").read_text()


# -- _matrix_job.sh under dash with a fake python ---------------------------------------------

FAKE_PYTHON = """
echo "fake python $*"
[ -n "${FAKE_RESULT:-}" ] && echo '{"status": "failed"}' > "$FAKE_RESULT"
[ -n "${FAKE_MESSAGE:-}" ] && echo "$FAKE_MESSAGE" >&2
[ "${FAKE_EXIT:-0}" = kill ] && kill -9 $$
exit "${FAKE_EXIT:-0}"
"""


def _run_job(tmp_path, **fake):
    _need("dash")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _tool(bin_dir, "python", FAKE_PYTHON)
    job_dir = tmp_path / "job"
    result = subprocess.run(["dash", str(JOB), str(job_dir), "hub", "sarm", "cuda", "--", "python", "bench.py",
                             "--source", "hub"], env=_env(bin_dir, **fake), capture_output=True, text=True,
                            timeout=30)
    return result, job_dir


def test_job_records_success(tmp_path):
    result, job_dir = _run_job(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (job_dir / "exit_status").read_text() == "0\n"
    assert (job_dir / "status").read_text() == "ok\n"
    assert "fake python bench.py --source hub" in (job_dir / "job.log").read_text()
    assert "fake python bench.py --source hub" in result.stdout  # still in the SLURM log too
    assert not (job_dir / "failed.json").exists()


@pytest.mark.parametrize("exit_code, message, status", [
    ("3", 'ValueError: bad "value" in C:\\path', "failed"),
    ("1", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("kill", "", "oom"),
])
def test_job_propagates_failure_and_reports_it(tmp_path, exit_code, message, status):
    result, job_dir = _run_job(tmp_path, FAKE_EXIT=exit_code, FAKE_MESSAGE=message)
    expected = 137 if exit_code == "kill" else int(exit_code)
    assert result.returncode == expected
    assert (job_dir / "exit_status").read_text() == f"{expected}\n"
    assert (job_dir / "status").read_text() == f"{status}\n"
    record = json.loads((job_dir / "failed.json").read_text())
    assert record["status"] == status and record["exit_code"] == expected
    assert (record["source"], record["mode"], record["decode"]) == ("hub", "sarm", "cuda")
    assert record["error"].startswith(f"exit {expected}")
    if message:
        assert message.split(":")[0] in record["error"]


def test_job_keeps_the_benchmarks_own_failure_record(tmp_path):
    (tmp_path / "job").mkdir()
    result, job_dir = _run_job(tmp_path, FAKE_EXIT="4", FAKE_RESULT=str(tmp_path / "job" / "hub-sarm-cuda.json"))
    assert result.returncode == 4
    assert not (job_dir / "failed.json").exists()


def test_job_refuses_a_call_without_separator(tmp_path):
    _need("dash")
    result = subprocess.run(["dash", str(JOB), str(tmp_path), "hub", "sarm", "cuda", "python", "x"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "usage:" in result.stderr


# -- train_streaming_robocasa.sh under dash with fake scontrol / srun / accelerate ---------------

@pytest.mark.parametrize("conda_env", ["", "train-env"])
def test_training_launch_gives_each_node_its_rank(tmp_path, conda_env):
    _need("dash")
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    _tool(bin_dir, "scontrol", 'echo node-a; echo node-b\n')
    # srun: skip its options, then start the task once per node, as SLURM would.
    _tool(bin_dir, "srun", """
while [ "${1#-}" != "$1" ]; do shift; done
SLURM_PROCID=0 "$@" && SLURM_PROCID=1 "$@"
""")
    _tool(bin_dir, "accelerate", f'printf "%s\\n" "$@" > "{record}/accelerate-$SLURM_PROCID"\n')
    _tool(bin_dir, "conda", f'echo "$*" > "{record}/conda-$SLURM_PROCID"; shift 4; exec "$@"\n')
    script = tmp_path / "examples" / "scaling" / "train_streaming_multinode.py"
    script.parent.mkdir(parents=True)
    script.touch()

    result = subprocess.run(["dash", str(TRAIN), "--max-steps", "5"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=30,
                            env=_env(bin_dir, SLURM_JOB_NODELIST="node-[a-b]", SLURM_NNODES="2",
                                     SLURM_JOB_ID="77", GPUS_PER_NODE="4", DATASET="/data/robocasa",
                                     CONDA_ENV=conda_env))
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        argv = (record / f"accelerate-{rank}").read_text().splitlines()
        assert argv == ["launch", "--multi_gpu", "--num_machines", "2", "--num_processes", "8",
                        "--machine_rank", str(rank), "--main_process_ip", "node-a", "--main_process_port",
                        "29500", "examples/scaling/train_streaming_multinode.py", "--output-dir",
                        "outputs/train_streaming_robocasa/77", "--dataset", "/data/robocasa",
                        "--max-steps", "5"]
        conda = record / f"conda-{rank}"
        if conda_env:
            assert conda.read_text().startswith(f"run --no-capture-output -n {conda_env} accelerate launch")
        else:
            assert not conda.exists()


def test_training_outside_slurm_says_so(tmp_path):
    _need("dash")
    result = subprocess.run(["dash", str(TRAIN)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                            timeout=30)
    assert result.returncode != 0 and "submit this with sbatch" in result.stderr
