"""deploy/mesos and `spark-bookie deploy render`: the Marathon group Marathon itself would accept.

Validated against Marathon's own app-definition and group JSON schemas (copied into
tests/data/marathon/ from ../shared/data/marathon so a fresh clone can run this), with the group's
relative `$ref` to AppDefinition.json resolved through a referencing registry. The DC/OS template
(marathon.json.mustache, rendered with chevron) must give exactly what the Python renderer gives.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import chevron
import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

from metadata.layout import parse_connect_string
from spark_bookie.deploy.render import OPTIONS_SCHEMA, default_options, render_group, resolve_options
from spark_bookie.errors import ConfigError

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "mesos"
SCHEMAS = ROOT / "tests" / "data" / "marathon"
SHARED_SCHEMAS = ROOT.parent / "shared" / "data" / "marathon"
EXAMPLE = DEPLOY / "bk-config.json"


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def validators() -> tuple[jsonschema.Draft4Validator, jsonschema.Draft4Validator]:
    """(group validator, app validator). Marathon's schemas are draft-04 (`id`, not `$id`)."""
    app_schema = _load(SCHEMAS / "AppDefinition.schema.json")
    group_schema = _load(SCHEMAS / "Group.schema.json")
    # Group.json says `"$ref": "./AppDefinition.json"`, relative to its own `id`.
    app_uri = group_schema["id"].rsplit("/", 1)[0] + "/AppDefinition.json"
    registry: Registry = Registry().with_resources([
        (app_uri, Resource.from_contents(app_schema, default_specification=DRAFT4)),
        (group_schema["id"], Resource.from_contents(group_schema, default_specification=DRAFT4)),
    ])
    return (jsonschema.Draft4Validator(group_schema, registry=registry),
            jsonschema.Draft4Validator(app_schema))


def _schema_errors(validator: jsonschema.Draft4Validator, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def _assert_valid(group: dict[str, Any], validators: tuple[Any, Any]) -> None:
    group_v, app_v = validators
    assert _schema_errors(group_v, group) == []
    for app in group["apps"]:
        assert _schema_errors(app_v, app) == [], app["id"]


def _apps(group: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["id"].rsplit("/", 1)[1]: a for a in group["apps"]}


# ---------------------------------------------------------------------- schema copies


def test_schema_copy_is_byte_identical_to_shared() -> None:
    if not SHARED_SCHEMAS.is_dir():
        pytest.skip(f"{SHARED_SCHEMAS} is not beside this checkout (fresh clone): nothing to compare")
    shared = sorted(p.name for p in SHARED_SCHEMAS.iterdir() if p.is_file())
    assert shared, "the shared folder holds the schemas"
    for name in shared:
        assert (SCHEMAS / name).read_bytes() == (SHARED_SCHEMAS / name).read_bytes(), name


def test_schema_validation_is_not_vacuous(validators: tuple[Any, Any]) -> None:
    """A bad app inside the group is caught: the group's relative $ref really reaches AppDefinition."""
    group = render_group()
    broken = copy.deepcopy(group)
    _apps(broken)["spark-workers"]["instances"] = -1
    _apps(broken)["spark-master"]["no-such-field"] = 1
    errors = _schema_errors(validators[0], broken)
    assert any("-1 is less than the minimum of 0" in e for e in errors), errors
    assert any("no-such-field" in e for e in errors), errors
    both = copy.deepcopy(group)
    _apps(both)["spark-master"]["args"] = ["x"]       # Marathon refuses cmd and args together
    assert _schema_errors(validators[0], both)


# ---------------------------------------------------------------------- rendered group


def test_default_options_render_a_valid_group(validators: tuple[Any, Any]) -> None:
    group = render_group()
    _assert_valid(group, validators)
    assert group["id"] == "/spark-bookie"
    apps = _apps(group)
    assert sorted(apps) == ["bookie-cluster-driver", "spark-master", "spark-workers"]
    workers = apps["spark-workers"]
    assert workers["instances"] == 3
    assert workers["constraints"] == [["hostname", "UNIQUE"]]
    vols = workers["container"]["volumes"]
    persistent = [v for v in vols if "persistent" in v]
    assert persistent == [{"containerPath": "bookie-data", "mode": "RW", "persistent": {"type": "root", "size": 20000}}]
    assert {"containerPath": "/var/lib/spark-bookie", "hostPath": "bookie-data", "mode": "RW"} in vols
    assert workers["upgradeStrategy"] == {"minimumHealthCapacity": 0.5, "maximumOverCapacity": 0}
    assert workers["unreachableStrategy"] == "disabled"
    assert workers["residency"] == {"taskLostBehavior": "WAIT_FOREVER"}
    assert [p["port"] for p in workers["portDefinitions"]] == [7078, 8081, 7079]
    assert workers["requirePorts"] is True
    assert workers["cmd"].startswith("export SPARK_BOOKIE_ADVERTISED_HOST=$HOST && exec spark-class ")
    assert "spark://spark-master-spark-bookie.marathon.mesos:7077" in workers["cmd"]
    assert workers["dependencies"] == ["/spark-bookie/spark-master"]
    assert apps["bookie-cluster-driver"]["dependencies"] == ["/spark-bookie/spark-workers"]


ADMIN_PORT = 31003  # what Marathon would give the driver's fourth port ($PORT3, expanded by the shell)


def _job_args(words: list[str]) -> argparse.Namespace:
    """Parse the hosting job's arguments with the job's own parser, as its driver would (the
    admin port's $PORT3 expanded as the shell would; the Spark ports stay literal for the checks)."""
    from spark_bookie.hosting.config import add_arguments

    ap = argparse.ArgumentParser()
    add_arguments(ap)
    return ap.parse_args([str(ADMIN_PORT) if w == "$PORT3" else w for w in words])


def test_driver_initialises_the_cluster_then_runs_the_hosting_job() -> None:
    cmd = _apps(render_group())["bookie-cluster-driver"]["cmd"]
    init, _, run = cmd.partition(" && ")
    assert init == "spark-bookie init --zk master.mesos:2181/spark-bookie/ledgers"
    words = shlex.split(run)
    assert words[:4] == ["exec", "python3", "-m", "jobs.bookie_cluster"]
    args = _job_args(words[4:])                      # the flags exist and parse: a drifted job fails here
    assert args.master == "spark://spark-master-spark-bookie.marathon.mesos:7077"
    assert args.zk == "master.mesos:2181/spark-bookie/ledgers"
    assert (args.bookies, args.data_root, args.name, args.base_port) == (3, "/var/lib/spark-bookie",
                                                                          "spark-bookie", 3181)
    assert args.task_max_failures == 1000
    confs = dict(c.split("=", 1) for c in args.conf)
    assert confs["spark.driver.port"] == "$PORT0" and confs["spark.ui.port"] == "$PORT2"
    assert args.http_port == ADMIN_PORT and args.http_host == "127.0.0.1"   # /metrics, admin API, health
    check = _apps(render_group())["bookie-cluster-driver"]["healthChecks"][0]
    assert (check["portIndex"], check["path"]) == (3, "/api/v1/bookie/is_ready")
    assert confs["spark.blockManager.port"] == "7079"
    assert confs["spark.executor.cores"] == "1" and confs["spark.executor.memory"] == "2048m"


def test_driver_arguments_make_a_valid_hosting_config() -> None:
    from spark_bookie.hosting.config import config_from_args

    for options in ({}, _load(EXAMPLE)):
        run = _apps(render_group(options))["bookie-cluster-driver"]["cmd"].partition(" && ")[2]
        cfg = config_from_args(_job_args(shlex.split(run)[4:]))
        o = resolve_options(options)
        assert cfg.hosting.bookies == o["bookie"]["instances"]
        assert cfg.hosting.port(0) == o["bookie"]["service_port"]
        assert cfg.hosting.slot_dir(0).is_relative_to(o["bookie"]["data_root"])   # on the persistent volume
        assert cfg.task_max_failures == o["spark"]["task_max_failures"]


def test_bookie_connect_string_is_one_our_metadata_layer_parses() -> None:
    env = _apps(render_group())["spark-workers"]["env"]
    info = parse_connect_string(env["SPARK_BOOKIE_ZK"])
    assert info.root == "/spark-bookie/ledgers"
    assert info.hosts == ("master.mesos:2181",)


def test_example_options_render_a_valid_group(validators: tuple[Any, Any]) -> None:
    options = _load(EXAMPLE)
    group = render_group(options)
    _assert_valid(group, validators)
    apps = _apps(group)
    workers = apps["spark-workers"]
    assert group["id"] == "/ledgers-prod"
    assert workers["instances"] == options["bookie"]["instances"] == 5
    assert workers["container"]["volumes"][1]["persistent"]["size"] == options["bookie"]["volume_size"]
    assert workers["container"]["docker"]["image"] == options["spark"]["docker_image"]
    assert "--cores 2 --memory 4096M" in workers["cmd"]
    assert "--bookies 5" in apps["bookie-cluster-driver"]["cmd"]
    zk = options["bookie"]["zk_client"] + "/ledgers-prod/ledgers"
    assert all(a["env"]["SPARK_BOOKIE_ZK"] == zk for a in group["apps"])


def test_partial_sections_keep_the_other_defaults() -> None:
    o = resolve_options({"bookie": {"instances": 7}})
    assert o["bookie"]["instances"] == 7
    assert o["bookie"]["zk_client"] == "master.mesos:2181"
    assert o["bookie"]["service_port"] == 3181
    assert o["spark"] == default_options()["spark"]


# ---------------------------------------------------------------------- bad options


@pytest.mark.parametrize(("options", "expected"), [
    ({"bookie": {"instances": 0}}, "bookie.instances: 0 is less than the minimum of 1"),
    ({"bookie": {"volume_size": "big"}}, "bookie.volume_size: 'big' is not of type 'integer'"),
    ({"bookie": {"volume_size": 20000.5}}, "bookie.volume_size: 20000.5 is not of type 'integer'"),
    ({"bookie": {"volume": 10}}, "bookie: unknown option(s) 'volume'; known: cpus, data_root, instances"),
    ({"bookkeeper": {}}, "(top level): unknown option(s) 'bookkeeper'; known: bookie, spark"),
    ({"bookie": {"name": "Bad_Name"}}, "bookie.name: 'Bad_Name' does not match"),
    ({"bookie": {"zk_client": "zk:2181/chroot"}}, "bookie.zk_client: 'zk:2181/chroot' does not match"),
    ({"bookie": {"service_port": 70000}}, "bookie.service_port: 70000 is greater than the maximum of 65535"),
    ({"spark": {"docker_image": 'img" && rm -rf /'}}, "spark.docker_image:"),
    ({"bookie": {"mem": 2048}}, "bookie.mem: 2048 MiB cannot hold the worker daemon"),
    ({"spark": {"driver_memory_mb": 4096}}, "spark.driver_mem: 2048 MiB is below the driver JVM's 4096 heap"),
    ({"spark": {"worker_webui_port": 8080}},
     "port 8080 is used by spark.master_webui_port and spark.worker_webui_port"),
    ({"bookie": {"service_port": 7076}}, "spark.master_port 7077 is inside the bookies' ports 7076..7078"),
    ({"bookie": {"service_port": 65534}}, "the bookies need ports 65534..65536, past 65535"),
])
def test_bad_options_give_a_clear_error(options: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        render_group(options)
    assert expected in str(info.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        render_group({"bookie": {"instances": 0, "cpus": "two", "oops": 1}})
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid deploy options:"
    assert len(lines) == 4
    assert any("bookie.cpus" in line for line in lines) and any("bookie.instances" in line for line in lines)


def test_string_options_cannot_carry_characters_a_template_would_escape() -> None:
    """DC/OS renders the mustache with HTML escaping; patterns keep every string option escape-free."""
    for section, spec in OPTIONS_SCHEMA["properties"].items():
        for key, prop in spec["properties"].items():
            if prop["type"] != "string":
                continue
            assert "pattern" in prop, f"{section}.{key} needs a pattern"
            for ch in "\"&<>'=` ":
                with pytest.raises(ConfigError):
                    resolve_options({section: {key: prop["default"] + ch}})


# ---------------------------------------------------------------------- package files


def test_config_json_is_the_renderers_options_schema() -> None:
    assert _load(DEPLOY / "config.json") == OPTIONS_SCHEMA, (
        "deploy/mesos/config.json and spark_bookie/deploy_render.py OPTIONS_SCHEMA differ: edit both")


def test_package_json_and_resource_json_agree_with_the_defaults() -> None:
    package = _load(DEPLOY / "package.json")
    resource = _load(DEPLOY / "resource.json")
    defaults = default_options()
    assert package["name"] == defaults["bookie"]["name"]
    assert package["packagingVersion"] == "3.0"
    assert resource["assets"]["container"]["docker"]["spark-bookie"] == defaults["spark"]["docker_image"]


@pytest.mark.parametrize("options_file", [None, EXAMPLE])
def test_mustache_template_renders_what_the_renderer_renders(options_file: Path | None) -> None:
    options = resolve_options(_load(options_file) if options_file else {})
    template = (DEPLOY / "marathon.json.mustache").read_text(encoding="utf-8")
    for tag in re.findall(r"{{\s*([^}]+?)\s*}}", template):     # a typo would render as "" silently
        section, _, key = tag.partition(".")
        assert key in options.get(section, {}), f"template uses unknown option {tag!r}"
    assert json.loads(chevron.render(template, options)) == render_group(options)


# ---------------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_bookie.cli", "deploy", "render", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_cli_writes_valid_json(tmp_path: Path, validators: tuple[Any, Any]) -> None:
    out = tmp_path / "group.json"
    done = _cli("--options", str(EXAMPLE), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    group = _load(out)
    _assert_valid(group, validators)
    assert group == render_group(_load(EXAMPLE))
    stdout = _cli()
    assert stdout.returncode == 0, stdout.stderr
    assert json.loads(stdout.stdout) == render_group()


def test_cli_reports_bad_options_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"bookie": {"instances": 0, "volume_size": "big"}}), encoding="utf-8")
    done = _cli("--options", str(bad))
    assert done.returncode == 2
    assert done.stdout == ""
    assert "bookie.instances: 0 is less than the minimum of 1" in done.stderr
    assert "bookie.volume_size: 'big' is not of type 'integer'" in done.stderr
    assert "Traceback" not in done.stderr
    missing = _cli("--options", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "cannot read options file" in missing.stderr
    bad.write_text("{not json", encoding="utf-8")
    garbled = _cli("--options", str(bad))
    assert garbled.returncode == 2 and "is not JSON" in garbled.stderr


# ---------------------------------------------------------------------- Spark 3.5 submit script


def _submit_dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(DEPLOY / "submit-spark35-mesos.sh"), *args], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})


def test_submit_script_builds_the_mesos_command() -> None:
    done = _submit_dry_run("--mesos-master", "mesos://zk://zk1:2181,zk2:2181/mesos", "--zk", "zk1:2181/sb/ledgers",
                           "--bookies", "4", "--executor-cores", "2", "--job", "/opt/job.py", "--dry-run",
                           "--name", "sb", "--base-port", "4000",
                           "--docker-image", "reg/sb:1", "--", "--conf", "spark.extra=1")
    assert done.returncode == 0, done.stderr
    init, submit = [shlex.split(line) for line in done.stdout.splitlines()]
    assert init == ["spark-bookie", "init", "--zk", "zk1:2181/sb/ledgers"]
    assert submit[:3] == ["spark-submit", "--master", "mesos://zk://zk1:2181,zk2:2181/mesos"]
    confs = dict(submit[i + 1].split("=", 1) for i, w in enumerate(submit) if w == "--conf")
    assert confs["spark.cores.max"] == "8"                 # 4 bookies x 2 cores = 4 executors
    assert confs["spark.executor.cores"] == "2"
    assert confs["spark.blockManager.port"] == "7079"      # one executor per agent
    assert confs["spark.speculation"] == "false"
    assert confs["spark.dynamicAllocation.enabled"] == "false"
    assert confs["spark.mesos.executor.docker.volumes"] == "/var/lib/spark-bookie:/var/lib/spark-bookie:rw"
    assert confs["spark.extra"] == "1"
    job_at = submit.index("/opt/job.py")
    args = _job_args(submit[job_at + 1:])
    assert (args.zk, args.bookies, args.data_root, args.name, args.base_port, args.task_max_failures) == (
        "zk1:2181/sb/ledgers", 4, "/var/lib/spark-bookie", "sb", 4000, 1000)


@pytest.mark.parametrize(("args", "expected"), [
    (["--zk", "z:1/a", "--bookies", "3"], "--mesos-master is required"),
    (["--mesos-master", "spark://m:7077", "--zk", "z:1/a", "--bookies", "3"], "must start with mesos://"),
    (["--mesos-master", "mesos://m:5050", "--zk", "z:1/a", "--bookies", "0"], "--bookies must be a positive"),
    (["--mesos-master", "mesos://m:5050", "--bookies", "3"], "--zk is required"),
    (["--mesos-master", "mesos://m:5050", "--zk", "z:1/a", "--bookies", "3", "--data-root", "rel"], "absolute path"),
    (["--mesos-master", "mesos://m:5050", "--zk", "z:1/a", "--bookies", "3", "--base-port", "65534"], "past"),
])
def test_submit_script_refuses_bad_arguments(args: list[str], expected: str) -> None:
    done = _submit_dry_run(*args, "--dry-run")
    assert done.returncode == 2
    assert expected in done.stderr
