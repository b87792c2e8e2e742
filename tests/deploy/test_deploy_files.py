"""deploy/: the Compose file, the Dockerfiles and the Kubernetes manifests, checked offline (no
Docker daemon, no cluster): they parse, name files and modules that exist, set only real
settings, and every manifest validates against the Kubernetes schemas (`kubernetes-validate`,
which bundles them). The trainer Job template is rendered by the scheduler's own manifest code.

`TUNELOOP_UPDATE_GOLDEN=1` rewrites deploy/k8s/trainer-job.yaml from what the provider renders.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes.client import ApiClient
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from services.scheduler.kubernetes_manifest import config_secret, job_manifest, object_name
from services.scheduler.ladder import load_ladder
from services.scheduler.lifecycle import trainer_env
from services.scheduler.providers import LaunchSpec
from shared.events import STREAMS
from shared.settings import ANY_ADDRESS, ServicePorts

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_DIR = DEPLOY / "compose"
K8S = DEPLOY / "k8s"
# A recent release whose schemas kubernetes-validate bundles.
KUBERNETES_VERSION = "1.37.0"
SERVICES = ("ingest", "scheduler", "evaluator", "hoster")
PORTS = ServicePorts()
# Files of deploy/k8s that are not kustomize resources, on purpose (kustomization.yaml says why).
NOT_RESOURCES = {"kustomization.yaml", "secret.example.yaml", "trainer-job.yaml"}
SETTINGS_MODULES = ["shared.settings"] + [
    f"services.{name}.config" for name in ("ingest", "scheduler", "evaluator", "hoster")
]
TUNELOOP_NAME = re.compile(r"\bTUNELOOP_[A-Z0-9_]+")
# A setting naming another service's base URL: TUNELOOP_<caller>_<callee>_URL.
SERVICE_URL_SETTING = re.compile(
    rf"TUNELOOP_({'|'.join(SERVICES).upper()})_({'|'.join(SERVICES).upper()})_URL"
)
# Pod Security `restricted`: the volume types it allows, and the one capability a container may add.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:?[-?])?")


# --- helpers ----------------------------------------------------------------------------------


def setting_names() -> set[str]:
    """Every environment variable a settings class reads: env_prefix + field name, or the
    field's own aliases (DATABASE_URL / TUNELOOP_DATABASE_URL)."""
    names: set[str] = set()
    for module_name in SETTINGS_MODULES:
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if not (
                isinstance(value, type)
                and issubclass(value, BaseSettings)
                and value is not BaseSettings
                and value.__module__ == module_name
            ):
                continue
            prefix = str(value.model_config.get("env_prefix", ""))
            for field_name, field in value.model_fields.items():
                alias = field.validation_alias
                if isinstance(alias, AliasChoices):
                    names.update(str(choice).upper() for choice in alias.choices)
                elif isinstance(alias, str):
                    names.add(alias.upper())
                else:
                    names.add(f"{prefix}{field_name}".upper())
    return names


def compose() -> dict[str, Any]:
    document = yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text())
    assert isinstance(document, dict)
    return document


def env_example() -> dict[str, str]:
    pairs = {}
    for line in (COMPOSE_DIR / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f".env.example: {line!r} is not NAME=value"
            pairs[key.strip()] = value
    return pairs


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${NAME}, ${NAME:-default} and ${NAME:?message}, from `env`."""

    def one(match: re.Match[str]) -> str:
        name, rest = match.group(1), match.group(2) or ""
        if name in env:
            return env[name]
        if rest.startswith(":-") or rest.startswith("-"):
            return rest.split("-", 1)[1]
        raise AssertionError(f"${{{name}}} has no value and no default")

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)((?::?-)[^}]*|(?::?\?)[^}]*)?\}", one, value)


def k8s_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def all_k8s(kind: str) -> list[dict[str, Any]]:
    return [doc for path in k8s_files() for doc in k8s_documents(path) if doc["kind"] == kind]


def pod_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def module_exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return (path / "__main__.py").is_file() or path.with_suffix(".py").is_file()


def python_module(command: list[str]) -> str | None:
    if command[:2] == ["python", "-m"]:
        return command[2]
    return None


def service_url_settings() -> dict[str, str]:
    """Every setting naming another service's URL -> the service it names (e.g.
    TUNELOOP_INGEST_HOSTER_URL -> hoster), from the settings classes themselves."""
    return {
        name: match.group(2).lower()
        for name in setting_names()
        if (match := SERVICE_URL_SETTING.fullmatch(name))
    }


def restricted_problems(pod: dict[str, Any]) -> list[str]:
    """Where a pod spec breaks Pod Security `restricted` (its baseline checks included), as the
    admission controller reads it: pod-level settings hold for every container that does not
    override them."""
    problems = []
    pod_context = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(key)
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']}: {sorted(kinds)}")
    for container in pod_containers(pod):
        name = container["name"]
        context = container.get("securityContext", {})

        def setting(key: str, context: dict[str, Any] = context) -> Any:
            return context.get(key, pod_context.get(key))

        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if setting("runAsNonRoot") is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if setting("runAsUser") == 0:
            problems.append(f"{name}: runAsUser 0")
        if (setting("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile is not RuntimeDefault or Localhost")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds {capabilities['add']}")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            problems.append(f"{name}: hostPort")
    return problems


def render_trainer_job(tmp_path: Path) -> list[dict[str, Any]]:
    """What the kubernetes provider creates for one attempt on the rung of deploy/k8s's
    providers ConfigMap: the Secret holding job.json and the Job, as the API receives them."""
    configmaps = {doc["metadata"]["name"]: doc for doc in all_k8s("ConfigMap")}
    providers = configmaps["tuneloop-providers"]["data"]["providers.yaml"]
    threads = int(configmaps["tuneloop-config"]["data"]["TUNELOOP_SCHEDULER_TRAINER_THREADS"])
    path = tmp_path / "providers.yaml"
    path.write_text(providers)
    (rung,) = load_ladder(path).providers
    spec = LaunchSpec(
        job_id="ftjob-example",
        attempt_id="attempt-example",
        tenant="example_tenant",
        config={},
        work_dir=Path("/nonexistent"),  # the local provider's; a Job has none
        env=trainer_env(threads),
        device=rung.device,
        device_count=rung.device_count,
        max_runtime_s=rung.max_runtime_s,
    )
    assert rung.kubernetes is not None
    name = object_name(spec.attempt_id)
    client = ApiClient()
    secret = client.sanitize_for_serialization(config_secret(spec, name, rung.kubernetes.namespace))  # type: ignore[no-untyped-call]
    secret["stringData"]["job.json"] = "<the attempt's trainer config, written by the scheduler>"
    job = client.sanitize_for_serialization(job_manifest(spec, rung, name))  # type: ignore[no-untyped-call]
    return [secret, job]


# --- Compose ----------------------------------------------------------------------------------


def test_compose_builds_name_dockerfiles_that_exist() -> None:
    built = {}
    for name, service in compose()["services"].items():
        build = service.get("build")
        if build is None:
            continue
        context = (COMPOSE_DIR / build["context"]).resolve()
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"services.{name}.build: {dockerfile} does not exist"
        assert context == ROOT, f"services.{name}.build.context: the repository root, not {context}"
        built[name] = dockerfile.relative_to(ROOT).as_posix()
    assert built == {
        "migrate": "deploy/Dockerfile",
        "ingest": "deploy/Dockerfile",
        "scheduler": "deploy/Dockerfile",
        "evaluator": "deploy/Dockerfile",
        "hoster": "deploy/Dockerfile",
        "scheduler-gpu": "deploy/Dockerfile",
        "hoster-gpu": "deploy/Dockerfile.vllm",
    }


def test_compose_commands_name_modules_that_exist() -> None:
    modules = {}
    for name, service in compose()["services"].items():
        command = service.get("command")
        module = python_module(command) if command else None
        if module is not None:
            assert module_exists(module), f"services.{name}.command: no module {module}"
            modules[name] = module
    for service in SERVICES:
        assert modules[service] == f"services.{service}"
    assert modules["scheduler-gpu"] == "services.scheduler"
    assert modules["hoster-gpu"] == "services.hoster"
    assert modules["migrate"] == "shared.db"


def test_compose_healthchecks_ask_each_service_on_its_own_port() -> None:
    services = compose()["services"]
    for name in [*SERVICES, "scheduler-gpu", "hoster-gpu"]:
        own = name.removesuffix("-gpu")
        check = " ".join(services[name]["healthcheck"]["test"])
        assert f"http://127.0.0.1:{PORTS.port_of(own)}/healthz" in check, name


def test_compose_starts_services_after_the_infrastructure_and_migrations() -> None:
    services = compose()["services"]
    for name in ("nats", "minio", "postgres"):
        assert "healthcheck" in services[name], name
    for name in [*SERVICES, "scheduler-gpu", "hoster-gpu"]:
        depends = services[name]["depends_on"]
        assert depends["nats"] == {"condition": "service_healthy"}, name
        assert depends["minio"] == {"condition": "service_healthy"}, name
        assert depends["migrate"] == {"condition": "service_completed_successfully"}, name
        # The gateway creates the bucket at start; the rest write to it.
        if name != "ingest":
            assert depends["ingest"] == {"condition": "service_healthy"}, name


def test_compose_sets_only_real_settings() -> None:
    valid = setting_names()
    set_here: dict[str, str] = {}
    for name, service in compose()["services"].items():
        for key in service.get("environment", {}):
            set_here[key] = f"services.{name}.environment"
    for key in env_example():
        set_here[key] = ".env.example"
    for dockerfile in ("Dockerfile", "Dockerfile.vllm"):
        text = (DEPLOY / dockerfile).read_text()
        for line in re.findall(r"^ENV (?:.*\\\n)*.*", text, flags=re.MULTILINE):
            for key in re.findall(r"\b(TUNELOOP_[A-Z0-9_]+)=", line):
                set_here[key] = f"deploy/{dockerfile}"
    tuneloop = {key: where for key, where in set_here.items() if key.startswith("TUNELOOP_")}
    unknown = {key: where for key, where in tuneloop.items() if key not in valid}
    assert not unknown, f"not settings (shared/settings.py, services/*/config.py): {unknown}"
    assert "TUNELOOP_DATABASE_URL" in tuneloop
    assert "TUNELOOP_HOSTER_ENGINE" in tuneloop


def test_compose_runs_each_service_in_its_own_container_publishing_only_the_gateway() -> None:
    services = compose()["services"]
    for name, service in services.items():
        # No shared network namespace: each reaches the others by name (the *_URL settings).
        assert "network_mode" not in service, f"services.{name}.network_mode"
    published = {name for name, service in services.items() if service.get("ports")}
    assert published == {"ingest"}
    (port,) = services["ingest"]["ports"]
    assert interpolate(port, {}) == f"127.0.0.1:{PORTS.ingest_port}:{PORTS.ingest_port}"


def compose_names(service: str) -> set[str]:
    """The names a Compose service answers to on the project network: its own, its aliases."""
    found = compose()["services"][service]
    aliases = (found.get("networks") or {}).get("default", {}).get("aliases", [])
    return {service, *aliases}


def test_compose_service_urls_name_the_container_that_runs_that_service() -> None:
    services = compose()["services"]
    url_settings = service_url_settings()
    # What issue 26 added and what existed: ingest -> scheduler/evaluator/hoster, the
    # scheduler -> ingest, the evaluator -> ingest/hoster.
    assert set(url_settings) == {
        "TUNELOOP_INGEST_SCHEDULER_URL",
        "TUNELOOP_INGEST_EVALUATOR_URL",
        "TUNELOOP_INGEST_HOSTER_URL",
        "TUNELOOP_SCHEDULER_INGEST_URL",
        "TUNELOOP_EVALUATOR_INGEST_URL",
        "TUNELOOP_EVALUATOR_HOSTER_URL",
    }
    for name, service in services.items():
        command = service.get("command") or []
        if python_module(command) not in {f"services.{s}" for s in SERVICES}:
            continue
        environment = service["environment"]
        for setting, callee in url_settings.items():
            assert setting in environment, f"services.{name}: {setting} unset"
            host, _, port = environment[setting].removeprefix("http://").partition(":")
            assert int(port) == PORTS.port_of(callee), f"services.{name}: {setting}"
            # Every container that runs the callee (its cpu and gpu versions) answers to host.
            runs_it = [
                other
                for other, spec in services.items()
                if python_module(spec.get("command") or []) == f"services.{callee}"
            ]
            assert runs_it, callee
            for other in runs_it:
                assert host in compose_names(other), f"{setting}: {other} is not {host}"


def test_compose_hoster_advertises_engines_by_a_name_the_others_resolve() -> None:
    services = compose()["services"]
    for name in ("hoster", "hoster-gpu"):
        environment = services[name]["environment"]
        assert environment["TUNELOOP_HOSTER_ENGINE_BIND_HOST"] in ANY_ADDRESS, name
        assert environment["TUNELOOP_HOSTER_ENGINE_HOST"] in compose_names(name), name


def test_compose_required_variables_are_in_the_env_example() -> None:
    text = (COMPOSE_DIR / "compose.yaml").read_text()
    example = env_example()
    for name, mode in INTERPOLATION.findall(text):
        if mode.endswith("?") or mode == "":
            assert name in example, f"compose.yaml needs ${{{name}}}: add it to .env.example"


def test_compose_gpu_profile_runs_vllm_and_cuda_on_nvidia_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    services = compose()["services"]
    example = env_example()
    assert set(example["COMPOSE_PROFILES"].split(",")) == {"cpu"}
    for name in ("scheduler", "hoster"):
        assert services[name]["profiles"] == ["cpu"]
        assert services[f"{name}-gpu"]["profiles"] == ["gpu"]
    for name in ("ingest", "evaluator", "migrate", "nats", "minio", "postgres"):
        assert "profiles" not in services[name], f"{name} runs in every profile"
    for name in ("scheduler-gpu", "hoster-gpu"):
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia", name
        assert "gpu" in device["capabilities"], name
    assert services["scheduler-gpu"]["build"]["args"]["TORCH_VARIANT"].startswith("${TORCH_VARIANT")
    assert "TORCH_VARIANT" in (DEPLOY / "Dockerfile").read_text()
    assert "FROM ${VLLM_IMAGE}" in (DEPLOY / "Dockerfile.vllm").read_text()
    assert "ARG VLLM_IMAGE=vllm/vllm-openai:" in (DEPLOY / "Dockerfile.vllm").read_text()

    # The hoster's settings as the gpu profile sets them are accepted (engine vllm needs a
    # known GPU class and a command).
    from services.hoster.config import HosterSettings

    environment = services["hoster-gpu"]["environment"]
    for key, value in environment.items():
        if key.startswith("TUNELOOP_HOSTER_"):
            monkeypatch.setenv(key, interpolate(str(value), {}))
    hoster = HosterSettings()
    assert hoster.engine == "vllm"
    assert hoster.vllm_command == "vllm"


def test_nats_config_takes_the_largest_event() -> None:
    config = (COMPOSE_DIR / "nats.conf").read_text()
    (limit,) = re.findall(r"^max_payload:\s*(\d+)", config, flags=re.MULTILINE)
    assert int(limit) >= max(stream.max_msg_size for stream in STREAMS)
    nats = compose()["services"]["nats"]
    assert "-js" in nats["command"]
    assert any(volume.endswith(":/data") for volume in nats["volumes"])


# --- Dockerfiles ------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.vllm"])
def test_dockerfile_runs_as_a_non_root_user_and_copies_what_exists(dockerfile: str) -> None:
    text = (DEPLOY / dockerfile).read_text()
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.MULTILINE)
    assert users, f"{dockerfile}: no USER"
    assert users[-1].split(":")[0] not in ("0", "root"), f"{dockerfile}: runs as root"
    for line in re.findall(r"^COPY\s+(?!--from)(?:--\S+\s+)*(.+)$", text, flags=re.MULTILINE):
        *sources, _target = line.split()
        for source in sources:
            assert (ROOT / source).exists(), f"{dockerfile}: COPY {source}: not in the repository"


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", "everything is left out unless named"
    kept = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    text = (DEPLOY / "Dockerfile").read_text()
    copied = set()
    for line in re.findall(r"^COPY\s+(?!--from)(?:--\S+\s+)*(.+)$", text, flags=re.MULTILINE):
        copied.update(line.split()[:-1])
    assert copied <= kept, f"COPY sources the build context leaves out: {copied - kept}"


# --- Kubernetes -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", k8s_files(), ids=lambda path: path.name)
def test_manifest_validates_against_the_kubernetes_schemas(path: Path) -> None:
    documents = k8s_documents(path)
    assert documents, f"{path.name} holds no object"
    for document in documents:
        # strict: a misspelt or misplaced field is an error, not ignored.
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_a_bad_manifest_is_refused() -> None:
    """The check above can fail: a field in the wrong place is an error."""
    (deployment,) = k8s_documents(K8S / "ingest.yaml")[:1]
    deployment = json.loads(json.dumps(deployment))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = (
        "/healthz"
    )
    with pytest.raises(kubernetes_validate.ValidationError, match="paht"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    resources = kustomization["resources"]
    for resource in resources:
        assert (K8S / resource).is_file(), f"kustomization.yaml: {resource} does not exist"
    on_disk = {path.name for path in K8S.glob("*.yaml")} - NOT_RESOURCES
    assert set(resources) == on_disk
    assert len(resources) == len(set(resources))
    assert kustomization["namespace"] == "tuneloop"
    # The Deployments' `image: tuneloop` is what the images transformer rewrites.
    (image,) = kustomization["images"]
    for deployment in all_k8s("Deployment"):
        for container in pod_containers(deployment["spec"]["template"]["spec"]):
            assert container["image"] == image["name"], container["name"]


def test_each_service_is_a_deployment_with_probes_a_service_and_no_root() -> None:
    deployments = {doc["metadata"]["name"]: doc for doc in all_k8s("Deployment")}
    services = {doc["metadata"]["name"]: doc for doc in all_k8s("Service")}
    assert set(deployments) == {f"tuneloop-{name}" for name in SERVICES}
    for name in SERVICES:
        pod = deployments[f"tuneloop-{name}"]["spec"]["template"]["spec"]
        main = next(c for c in pod["containers"] if c["name"] == name)
        assert main["command"] == ["python", "-m", f"services.{name}"]
        assert module_exists(f"services.{name}")
        (port,) = main["ports"]
        assert port == {"name": "http", "containerPort": PORTS.port_of(name)}
        assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert main["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert {"configMapRef": {"name": "tuneloop-config"}} in main["envFrom"]
        assert {"secretRef": {"name": "tuneloop-secrets"}} in main["envFrom"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for container in pod_containers(pod):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert "memory" in container["resources"]["limits"], container["name"]
            module = python_module(container.get("command", []))
            if module is not None:
                assert module_exists(module), f"{name}/{container['name']}: no module {module}"
        service = services[f"tuneloop-{name}"]
        assert service["spec"]["selector"] == pod_labels(deployments[f"tuneloop-{name}"])
        assert service["spec"]["ports"][0]["port"] == PORTS.port_of(name)


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    return dict(labels)


def test_kubernetes_sets_only_real_settings() -> None:
    valid = setting_names()
    found: dict[str, str] = {}
    for path in k8s_files():
        for doc in k8s_documents(path):
            if doc["kind"] in ("ConfigMap", "Secret"):
                for key in {**doc.get("data", {}), **doc.get("stringData", {})}:
                    found[key] = f"{path.name} {doc['kind']} {doc['metadata']['name']}"
            if doc["kind"] == "Deployment":
                for container in pod_containers(doc["spec"]["template"]["spec"]):
                    for env in container.get("env", []):
                        found[env["name"]] = f"{path.name} {container['name']}"
    tuneloop = {key: where for key, where in found.items() if TUNELOOP_NAME.fullmatch(key)}
    unknown = {key: where for key, where in tuneloop.items() if key not in valid}
    assert not unknown, f"not settings (shared/settings.py, services/*/config.py): {unknown}"
    # What a production start needs is named somewhere: config or the Secret template.
    for needed in (
        "TUNELOOP_NATS_URL",
        "TUNELOOP_S3_ENDPOINT",
        "TUNELOOP_DATABASE_URL",
        "TUNELOOP_AUTH_ADMIN_TOKEN",
        "TUNELOOP_AUTH_SERVICE_TOKEN",
        "TUNELOOP_SCHEDULER_WEBHOOK_SECRET",
        "TUNELOOP_S3_SECRET_KEY",
    ):
        assert needed in tuneloop, needed


def test_kubernetes_service_urls_name_the_services_of_their_owners() -> None:
    (config,) = (c for c in all_k8s("ConfigMap") if c["metadata"]["name"] == "tuneloop-config")
    services = {doc["metadata"]["name"]: doc for doc in all_k8s("Service")}
    for setting, callee in service_url_settings().items():
        assert setting in config["data"], f"tuneloop-config: {setting} unset"
        host, _, port = config["data"][setting].removeprefix("http://").partition(":")
        assert host == f"tuneloop-{callee}", setting
        assert services[host]["spec"]["ports"][0]["port"] == int(port) == PORTS.port_of(callee)
    # One container a pod: nothing stands in for a service on a pod's loopback.
    for deployment in all_k8s("Deployment"):
        containers = deployment["spec"]["template"]["spec"]["containers"]
        assert len(containers) == 1, deployment["metadata"]["name"]
    # The hoster's engines: on every address of its pod, advertised at the pod's IP.
    assert config["data"]["TUNELOOP_HOSTER_ENGINE_BIND_HOST"] in ANY_ADDRESS
    (hoster,) = (d for d in all_k8s("Deployment") if d["metadata"]["name"] == "tuneloop-hoster")
    env = {e["name"]: e for e in hoster["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TUNELOOP_HOSTER_ENGINE_HOST"]["value"] == "$(POD_IP)"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_every_pod_meets_the_restricted_pod_security_the_namespace_enforces(
    tmp_path: Path,
) -> None:
    (namespace,) = all_k8s("Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in all_k8s("Deployment")}
    _, job = render_trainer_job(tmp_path)
    pods["trainer Job"] = job["spec"]["template"]["spec"]
    assert {name: restricted_problems(pod) for name, pod in pods.items()} == {
        name: [] for name in pods
    }


def test_a_pod_that_breaks_restricted_is_named() -> None:
    """The check above can fail: what the trainer pod lacked before issue 26, and a hostPath."""
    pod = {
        "containers": [{"name": "trainer", "image": "tuneloop"}],
        "volumes": [{"name": "models", "hostPath": {"path": "/models"}}],
    }
    assert restricted_problems(pod) == [
        "volume models: ['hostPath']",
        "trainer: allowPrivilegeEscalation is not false",
        "trainer: runAsNonRoot is not true",
        "trainer: seccompProfile is not RuntimeDefault or Localhost",
        "trainer: capabilities do not drop ALL",
    ]


def test_scheduler_may_do_what_the_kubernetes_provider_does() -> None:
    (scheduler,) = (
        d for d in all_k8s("Deployment") if d["metadata"]["name"] == "tuneloop-scheduler"
    )
    pod = scheduler["spec"]["template"]["spec"]
    account = pod["serviceAccountName"]
    assert pod["automountServiceAccountToken"] is True
    (binding,) = (b for b in all_k8s("RoleBinding") if b["subjects"][0]["name"] == account)
    (role,) = (r for r in all_k8s("Role") if r["metadata"]["name"] == binding["roleRef"]["name"])
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # The calls kubernetes_provider.py makes: create/get/delete Jobs, create/patch/delete the
    # config Secret, list/delete pods, read their logs.
    assert granted == {
        ("batch", "jobs", "create"),
        ("batch", "jobs", "get"),
        ("batch", "jobs", "delete"),
        ("", "secrets", "create"),
        ("", "secrets", "patch"),
        ("", "secrets", "delete"),
        ("", "pods", "list"),
        ("", "pods", "delete"),
        ("", "pods/log", "get"),
    }


def test_trainer_job_template_is_what_the_provider_renders(tmp_path: Path) -> None:
    rendered = render_trainer_job(tmp_path)
    path = K8S / "trainer-job.yaml"
    if os.environ.get("TUNELOOP_UPDATE_GOLDEN"):
        header = "".join(
            line + "\n"
            for line in path.read_text().splitlines()
            if line.startswith("#") and not line.startswith("# ---")
        )
        body = "---\n".join(yaml.safe_dump(doc, sort_keys=True) for doc in rendered)
        path.write_text(header + body)
    assert k8s_documents(path) == rendered
    secret, job = rendered
    pod = job["spec"]["template"]["spec"]
    # What the rung names exists here: the trainer's ServiceAccount and the storage Secret.
    accounts = {doc["metadata"]["name"] for doc in all_k8s("ServiceAccount")}
    assert pod["serviceAccountName"] in accounts
    storage = pod["containers"][0]["envFrom"][0]["secretRef"]["name"]
    secrets = {doc["metadata"]["name"]: doc for doc in all_k8s("Secret")}
    assert all(key.startswith("TUNELOOP_S3_") for key in secrets[storage]["stringData"])
    assert python_module(pod["containers"][0]["command"]) == "services.trainer"
    assert module_exists("services.trainer")
    assert job["metadata"]["namespace"] == secret["metadata"]["namespace"] == "tuneloop"
