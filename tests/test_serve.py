from prefect.utilities.callables import parameter_schema

from flows.pipeline import PIPELINE, pipeline
from flows.serve import build_deployments
from tasks.config import PROJECT_ROOT


def test_pipeline_and_each_stage_are_deployments_with_typed_config_forms():
    deployments = build_deployments([PROJECT_ROOT / "configs" / "tiny.yaml"], root="/tmp/x", cron="0 3 * * 0")
    names = [d.name for d in deployments]
    assert names == ["tiny"] + [f"tiny--{stage}" for stage in PIPELINE]
    full = deployments[0]
    assert full.schedules and full.schedules[0].schedule.cron == "0 3 * * 0"
    schema = parameter_schema(pipeline).model_dump()
    config_ref = schema["properties"]["config"]
    # The pydantic config model renders as a typed form (a JSON-schema object with its fields).
    definitions = schema.get("definitions", {})
    config_schema = definitions[config_ref["$ref"].split("/")[-1]] if "$ref" in config_ref else config_ref
    assert {"data", "chunk", "split", "bm25", "evaluation"} <= set(config_schema["properties"])
    bm25 = definitions["BM25Config"]["properties"]
    assert bm25["k1"]["type"] == "number" and bm25["k1"]["default"] == 0.9
    stage_run = deployments[1 + PIPELINE.index("chunk")]
    assert stage_run.parameters["stage"] == "chunk" and stage_run.parameters["config"]["name"] == "tiny"


def test_dense_stages_of_an_extended_config_are_deployments():
    deployments = build_deployments([PROJECT_ROOT / "configs" / "dpr.yaml"])
    names = [d.name for d in deployments]
    assert {"dpr", "dpr--train:dpr", "dpr--encode:dpr", "dpr--search:dpr", "dpr--hybrid"} <= set(names)
    # The deployment carries the resolved config (extends: merged), not a reference to the file.
    config = deployments[0].parameters["config"]
    assert config["data"]["squad"]["path"] == "squad/dev-v1.1-partial.json"
    assert config["dense"]["systems"][0]["model"]["pooling"] == "cls"
