"""Every planned version of every shipped config, on two fixed CPU profiles, equals the committed
list (tests/planned_versions.json): a refactor that changes what a version hashes fails here. A
deliberate change of versions rewrites the list (`python -m tests.test_planned_versions`) in a
commit of its own that says why."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


from tasks.config import PROJECT_ROOT

COMMITTED = Path(__file__).with_name("planned_versions.json")
# nq-open-dpr-tsv.yaml needs DPR's passage file, which these machines lack (tests/test_input_sources.py).
CONFIGS = sorted(p for p in (PROJECT_ROOT / "configs").glob("*.yaml") if p.stem != "nq-open-dpr-tsv")
# `auto` settings resolve per CPU (bf16 where the CPU has bf16 units), and some of them are hashed.
PROFILES = {"avx2": "fpu sse2 avx avx2 fma", "avx512_bf16": "fpu sse2 avx avx2 fma avx512f avx512_bf16"}


def planned_versions() -> dict[str, dict[str, dict[str, str]]]:
    """{profile: {config file: {stage: planned version}}}, with the CPU read from a fixed cpuinfo."""
    from flows.registry import plan_for
    from models import cpu_features, llamacpp_generator
    from tasks.config import load_config

    # Whether llama.cpp multiplies bf16 in hardware also asks the installed build (compiled for the
    # machine that installed it): here it follows the profile, as a build compiled on that CPU would.
    llamacpp_generator.llamacpp_bf16_in_hardware = lambda: cpu_features.has_bf16_units()

    found, before = {}, os.environ.get(cpu_features.CPUINFO_ENV)
    try:
        with tempfile.TemporaryDirectory() as folder:
            for profile, flags in PROFILES.items():
                cpuinfo = Path(folder) / profile
                cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
                os.environ[cpu_features.CPUINFO_ENV] = str(cpuinfo)
                cpu_features.cpu_flags.cache_clear()
                found[profile] = {}
                for config in CONFIGS:
                    plan = plan_for(load_config(config))
                    found[profile][config.name] = {stage.name: plan.planned_version(stage.name) for stage in plan}
    finally:
        if before is None:
            os.environ.pop(cpu_features.CPUINFO_ENV, None)
        else:
            os.environ[cpu_features.CPUINFO_ENV] = before
        cpu_features.cpu_flags.cache_clear()
    return found


def _planned_in_a_process_of_its_own() -> dict:
    # Its own process: planning imports every family (Prefect's logging among them), which would
    # otherwise bind to this test's captured stderr and outlive it.
    proc = subprocess.run([sys.executable, "-m", "tests.test_planned_versions", "--print"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_every_planned_version_of_every_shipped_config_is_the_committed_one(shared_data):
    committed = json.loads(COMMITTED.read_text())
    now = _planned_in_a_process_of_its_own()
    changed = [f"{profile} {config} {stage}: {committed[profile][config].get(stage)} -> {version}"
               for profile in now for config in now[profile] for stage, version in now[profile][config].items()
               if committed.get(profile, {}).get(config, {}).get(stage) != version]
    gone = [f"{profile} {config} {stage}" for profile in committed for config in committed[profile]
            for stage in committed[profile][config] if stage not in now.get(profile, {}).get(config, {})]
    assert not changed and not gone, (changed[:20], gone[:20])


def test_the_profiles_differ_where_auto_is_hashed():
    # Otherwise the second profile would check nothing the first does not.
    committed = json.loads(COMMITTED.read_text())
    assert committed["avx2"] != committed["avx512_bf16"]


if __name__ == "__main__":  # without --print: rewrite the list (a deliberate change of versions)
    text = json.dumps(planned_versions(), indent=1, sort_keys=True) + "\n"
    if sys.argv[1:] == ["--print"]:
        sys.stdout.write(text)
    else:
        COMMITTED.write_text(text)
        print(f"wrote {COMMITTED}", file=sys.stderr)
