import json
import os
import subprocess
import sys
import types

import pytest
from prefect.utilities.callables import parameter_schema

from flows.cli import main
from flows.pipeline import pipeline
from flows.registry import plan_for
from flows.serve import build_deployments
from tasks.config import PROJECT_ROOT, PipelineConfig, load_config


def test_pipeline_and_each_stage_are_deployments_with_typed_config_forms():
    deployments = build_deployments([PROJECT_ROOT / "configs" / "tiny.yaml"], root="/tmp/x", cron="0 3 * * 0")
    stages = plan_for(load_config(PROJECT_ROOT / "configs" / "tiny.yaml")).names()
    names = [d.name for d in deployments]
    assert names == ["tiny"] + [f"tiny--{stage}" for stage in stages] + ["tiny--corpus-refresh"]
    full = deployments[0]
    assert full.schedules and full.schedules[0].schedule.cron == "0 3 * * 0"
    assert not deployments[-1].schedules  # tiny.yaml sets no refresh.cron: the refresh runs on demand
    schema = parameter_schema(pipeline).model_dump()
    config_ref = schema["properties"]["config"]
    # The pydantic config model renders as a typed form (a JSON-schema object with its fields).
    definitions = schema.get("definitions", {})
    config_schema = definitions[config_ref["$ref"].split("/")[-1]] if "$ref" in config_ref else config_ref
    assert {"data", "chunk", "split", "bm25", "evaluation"} <= set(config_schema["properties"])
    bm25 = definitions["BM25Config"]["properties"]
    assert bm25["k1"]["type"] == "number" and bm25["k1"]["default"] == 0.9
    stage_run = deployments[1 + stages.index("chunk")]
    assert stage_run.parameters["stage"] == "chunk" and stage_run.parameters["config"]["name"] == "tiny"
    assert all(d.parameters["root"] == "/tmp/x" for d in deployments)


def test_dense_stages_of_an_extended_config_are_deployments():
    deployments = build_deployments([PROJECT_ROOT / "configs" / "dpr.yaml"])
    names = [d.name for d in deployments]
    assert {"dpr", "dpr--train:dpr", "dpr--encode:dpr", "dpr--search:dpr", "dpr--hybrid"} <= set(names)
    # The deployment carries the resolved config (extends: merged), not a reference to the file.
    config = deployments[0].parameters["config"]
    assert config["data"]["squad"]["path"] == "squad/dev-v1.1-partial.json"
    assert config["dense"]["systems"][0]["model"]["pooling"] == "cls"
    # The form's train section holds the trainer's settings as one object, and a run started from
    # it plans the versions the file plans.
    assert config["dense"]["systems"][0]["train"]["schedule"]["hard_negatives"] == 1
    definitions = parameter_schema(pipeline).model_dump()["definitions"]
    assert definitions["DenseTrainConfig"]["properties"]["schedule"]["$ref"].endswith("TrainerArgs")
    from_form = PipelineConfig.model_validate(json.loads(json.dumps(config)))
    from_form._config_dir = load_config(PROJECT_ROOT / "configs" / "dpr.yaml")._config_dir
    planned, file = plan_for(from_form), plan_for(load_config(PROJECT_ROOT / "configs" / "dpr.yaml"))
    assert {n: planned.planned_version(n) for n in planned.names()} == {n: file.planned_version(n) for n in file.names()}


def test_deployments_carry_an_absolute_root_when_none_is_given(tmp_path, monkeypatch):
    # A cron run must not write under whatever directory the serving process happens to be in.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PFORGE_HOME", raising=False)
    deployments = build_deployments([PROJECT_ROOT / "configs" / "tiny.yaml"], cron="0 3 * * 0")
    assert {d.parameters["root"] for d in deployments} == {str(tmp_path / "artifacts")}


def test_corpus_refresh_is_a_deployment_on_the_configs_cron_with_a_typed_form(tmp_path):
    from flows.refresh import corpus_refresh

    config = tmp_path / "weekly.yaml"
    config.write_text(f"extends: {PROJECT_ROOT / 'configs' / 'tiny.yaml'}\nname: weekly\n"
                      "refresh: {cron: '0 4 * * 1', dump: 'wikipedia/enwiki-*-pages-articles1.xml*.bz2'}\n")
    deployments = {d.name: d for d in build_deployments([config], root="/tmp/x")}
    refresh = deployments["weekly--corpus-refresh"]
    assert refresh.schedules[0].schedule.cron == "0 4 * * 1"
    assert refresh.parameters["dump"] == "wikipedia/enwiki-*-pages-articles1.xml*.bz2"
    assert refresh.parameters["root"] == "/tmp/x" and refresh.parameters["config"]["name"] == "weekly"
    assert not deployments["weekly"].schedules  # the pipeline itself keeps to --cron
    schema = parameter_schema(corpus_refresh).model_dump()
    assert schema["properties"]["dump"]["default"] is None
    fields = schema["definitions"]["RefreshConfig"]["properties"]
    assert fields["cron"]["description"] and fields["dense"]["default"] is True


def test_serve_waits_for_a_server_still_starting_with_bounded_back_off(monkeypatch):
    import httpx
    import pytest

    from flows import serve as serve_module

    answers = iter([httpx.ConnectError("refused"), httpx.Response(503), httpx.Response(200)])

    def get(url, timeout):
        assert url == "http://127.0.0.1:4200/api/health"
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(serve_module.httpx, "get", get)
    waits = []
    serve_module.wait_for_server("http://127.0.0.1:4200/api/", sleep=waits.append)
    assert waits == [0.5, 1.0]

    monkeypatch.setattr(serve_module.httpx, "get", lambda url, timeout: (_ for _ in ()).throw(httpx.ConnectError("refused")))
    clock = iter(range(0, 1000, 5))
    waits.clear()
    with pytest.raises(RuntimeError, match=r"the Prefect server at http://h:1/api did not answer within 30 s "
                                           r"\(ConnectError: refused\)"):
        serve_module.wait_for_server("http://h:1/api", within_s=30, sleep=waits.append, clock=lambda: next(clock))
    assert waits and max(waits) <= 8.0 and len(waits) < 10


# -- bad input ----------------------------------------------------------------------------------
class _Unreachable(types.ModuleType):
    def __getattr__(self, name):
        raise AssertionError(f"{self.__name__}.{name} was reached: the bad input was not refused first")


@pytest.fixture
def nothing_served(monkeypatch):
    """The flows, Prefect's `serve` and the wait for a server fail the test if a refusal comes after them."""
    for module in ("flows.pipeline", "flows.refresh", "flows.registry"):
        monkeypatch.setitem(sys.modules, module, _Unreachable(module))
    from flows import serve as serve_module

    def reached(*_args, **_kwargs):
        raise AssertionError("a server was waited for or served: the bad input was not refused first")
    monkeypatch.setattr("prefect.serve", reached)
    monkeypatch.setattr(serve_module, "wait_for_server", reached)


def _serve(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert captured.out == ""
    return code, captured.err


def _refused(code: int, err: str, start: str) -> None:
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"pforge: error: {start}"), err


def test_serve_refuses_bad_input_in_one_line_before_the_flows_load(tmp_path, capsys, nothing_served):
    tiny = PROJECT_ROOT / "configs" / "tiny.yaml"
    root = ["--root", str(tmp_path / "store")]
    _refused(*_serve(capsys, *root, "serve", str(tmp_path / "nope.yaml")), f"{tmp_path / 'nope.yaml'}: cannot read config")
    _refused(*_serve(capsys, *root, "serve", str(tiny), "--cron", "61 * * * *"),
             "--cron: '61 * * * *' is not a cron schedule (5 fields: minute hour day month weekday")
    hourly = tmp_path / "hourly.yaml"
    hourly.write_text(f"extends: {tiny}\nname: hourly\nrefresh: {{cron: '0 25 * * *'}}\n")
    _refused(*_serve(capsys, *root, "serve", str(hourly)), f"{hourly}: refresh.cron: '0 25 * * *' is not a cron schedule")
    twin = tmp_path / "twin.yaml"
    twin.write_text(f"extends: {tiny}\n")  # the name it inherits is tiny's
    _refused(*_serve(capsys, *root, "serve", str(tiny), str(twin)),
             f"{tiny} and {twin} are both named 'tiny': their deployments would replace each other's")
    (tmp_path / "a-file").write_text("")
    _refused(*_serve(capsys, "--root", str(tmp_path / "a-file"), "serve", str(tiny)),
             f"{tmp_path / 'a-file'}: no artifact store there (it is a file, not a folder)")
    assert not (tmp_path / "store").exists()  # nothing made


@pytest.mark.parametrize("api_url, problem", [("http://127.0.0.1:99999/api", "port 99999 is outside 1..65535"),
                                              ("localhost:4200/api", "not an http(s) URL"),
                                              ("http:///api", "no host in it")])
def test_serve_refuses_a_bad_prefect_api_url_in_one_line_before_any_wait(tmp_path, capsys, nothing_served, api_url,
                                                                         problem):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}):
        code, err = _serve(capsys, "--root", str(tmp_path), "serve", str(PROJECT_ROOT / "configs" / "tiny.yaml"))
    _refused(code, err, f"PREFECT_API_URL {api_url!r}: {problem}; set it to a Prefect server's API, e.g. "
                        "http://127.0.0.1:4200/api")


def test_serve_checks_its_inputs_then_serves_every_deployment(tmp_path, monkeypatch):
    from flows import serve as serve_module

    served = []
    monkeypatch.setattr("prefect.serve", lambda *deployments: served.extend(deployments))
    serve_module.serve_pipeline([PROJECT_ROOT / "configs" / "tiny.yaml"], root=str(tmp_path / "new-root"))
    assert served and served[0].name == "tiny" and served[-1].name == "tiny--corpus-refresh"


def test_a_refused_serve_never_imports_the_flows_or_prefects_serving(tmp_path):
    script = ("import sys; from flows.cli import main; code = main(['--root', sys.argv[1], 'serve', sys.argv[2]]); "
              "print(code, *(m in sys.modules for m in ('flows.pipeline', 'flows.refresh', 'prefect.flows', "
              "'prefect.deployments')))")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path), str(tmp_path / "nope.yaml")], cwd=PROJECT_ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["2", "False", "False", "False", "False"], done.stdout + done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"pforge: error: {tmp_path / 'nope.yaml'}: cannot read config")
