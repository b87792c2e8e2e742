"""Aliases, archived versions, delete rules, `root` and `parent`: on the real database (SQLite and
PostgreSQL) through the registry's functions, then through the HTTP routes with the official
openai SDK (`models.list/retrieve/delete`) where it has a call."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session

from services.hoster import aliases, api, registry
from services.hoster.config import HosterSettings
from services.hoster.deployments import Deployments
from services.hoster.errors import BadRequest, Conflict, HosterError, NotFound
from services.hoster.models import Deployment, ModelVersion
from shared import auth
from shared.events import Event, ModelAliasChanged
from shared.settings import S3Settings
from shared.storage import ObjectStore
from tests.services.hoster.test_registry import FT, SHA, decision

BASE = "SmolLM2-135M-Instruct"


def versions(session: Session, tenant: str = "acme", count: int = 2) -> list[ModelVersion]:
    """`count` versions of FT for the tenant (one job each), oldest first."""
    return [
        registry.register(
            session,
            decision(
                tenant=tenant,
                job_id=f"ftjob-{n}",
                best_checkpoint_uri=f"s3://b/tenants/{tenant}/jobs/ftjob-{n}/checkpoints/step-1",
            ),
            sha256=SHA,
        )[0]
        for n in range(1, count + 1)
    ]


def deployments(engine: Engine, tmp_path: Path) -> Deployments:
    return Deployments(
        settings=HosterSettings(work_dir=tmp_path),
        data_dir=tmp_path,
        store=ObjectStore.from_settings(S3Settings()),
        database=engine,
        factory=lambda spec, pid: pytest.fail("no engine may start"),
    )


# --- the registry's functions -------------------------------------------------------------------


def test_an_alias_is_set_moved_and_removed_and_names_its_version(db_session: Session) -> None:
    v1, v2 = versions(db_session)
    row, number, changed = aliases.set_alias(db_session, "acme", FT, "production", 1)
    assert (row.version_id, number) == (v1.id, 1)
    assert isinstance(changed, ModelAliasChanged)
    assert (changed.model_id, changed.alias, changed.model_version) == (FT, "production", 1)
    assert changed.previous_version is None
    assert aliases.set_alias(db_session, "acme", FT, "production", v1.id)[2] is None  # no change

    assert registry.resolve(db_session, "acme", f"{FT}@production").id == v1.id
    assert registry.resolve(db_session, "acme", FT).id == v2.id  # the name: its latest
    assert registry.resolve(db_session, "acme", f"{FT}@1").id == v1.id  # @<n>: version n

    _, number, moved = aliases.set_alias(db_session, "acme", FT, "production", v2.id)
    assert moved is not None
    assert (number, moved.model_version, moved.previous_version) == (2, 2, 1)
    aliases.set_alias(db_session, "acme", FT, "candidate", 1)
    listed = aliases.list_for(db_session, "acme", FT)
    assert [(a.alias, n) for a, n in listed] == [("candidate", 1), ("production", 2)]
    assert registry.get_model(db_session, "acme", f"{FT}@candidate")["version_id"] == v1.id

    aliases.remove_alias(db_session, "acme", FT, "production")
    with pytest.raises(NotFound, match="no alias 'production' of 'ft:"):
        registry.resolve(db_session, "acme", f"{FT}@production")
    with pytest.raises(NotFound, match="no alias 'production'"):
        aliases.remove_alias(db_session, "acme", FT, "production")


@pytest.mark.parametrize("alias", ["Production", "3", "", "a" * 65, "pro duction", "prod@x"])
def test_an_alias_is_lowercase_letters_digits_dash_underscore_and_not_a_number(
    db_session: Session, alias: str
) -> None:
    versions(db_session, count=1)
    with pytest.raises(BadRequest, match=r"alias: .* is not an alias"):
        aliases.set_alias(db_session, "acme", FT, alias, 1)


def test_an_alias_names_a_version_of_its_own_name_in_its_own_tenant(db_session: Session) -> None:
    (v1,) = versions(db_session, count=1)
    (g1,) = versions(db_session, tenant="globex", count=1)
    other = "ft:SmolLM2-135M-Instruct:other:ftjob-o"
    o1, _ = registry.register(
        db_session, decision(job_id="ftjob-o", fine_tuned_model=other), sha256=SHA
    )
    with pytest.raises(NotFound, match="has no version 7"):
        aliases.set_alias(db_session, "acme", FT, "production", 7)
    with pytest.raises(BadRequest, match=f"{o1.id} is a version of {other}"):
        aliases.set_alias(db_session, "acme", FT, "production", o1.id)
    with pytest.raises(NotFound, match=g1.id):  # another tenant's version
        aliases.set_alias(db_session, "acme", FT, "production", g1.id)
    with pytest.raises(NotFound, match="ft:nope:x:y"):
        aliases.set_alias(db_session, "acme", "ft:nope:x:y", "production", 1)

    aliases.set_alias(db_session, "acme", FT, "production", v1.id)
    with pytest.raises(NotFound, match="production"):  # globex has FT too, not the alias
        registry.resolve(db_session, "globex", f"{FT}@production")
    assert aliases.list_for(db_session, "globex", FT) == []
    aliases.set_alias(db_session, "globex", FT, "production", g1.id)
    assert registry.resolve(db_session, "acme", f"{FT}@production").id == v1.id
    assert registry.resolve(db_session, "globex", f"{FT}@production").id == g1.id


def test_an_archived_version_is_kept_and_readable_but_not_listed_deployed_or_aliased(
    db_engine: Engine, tmp_path: Path
) -> None:
    with Session(db_engine, expire_on_commit=False) as session:
        v1, v2 = versions(session)
        aliases.set_alias(session, "acme", FT, "production", 1)
        with pytest.raises(Conflict, match=f"{FT}@production"):  # an alias holds it
            registry.archive(session, "acme", v1.id)
        archived = registry.archive(session, "acme", v2.id)
        assert archived.archived_at is not None
        assert registry.archive(session, "acme", v2.id).archived_at == archived.archived_at

        assert registry.resolve(session, "acme", FT).id == v1.id  # latest not archived
        with pytest.raises(Conflict, match="is archived"):
            registry.resolve(session, "acme", v2.id)
        read = registry.get_model(session, "acme", v2.id)
        assert (read["version"], read["archived_at"]) == (2, int(archived.archived_at.timestamp()))
        with pytest.raises(Conflict, match="is archived: an archived version is not aliased"):
            aliases.set_alias(session, "acme", FT, "candidate", 2)

        listed = registry.list_models(session, "acme")
        assert [(m["id"], m.get("version")) for m in listed] == [(BASE, None), (FT, 1)]
        everything = registry.list_models(session, "acme", include_archived=True)
        assert [(m["id"], m.get("version")) for m in everything] == [
            (BASE, None),
            (FT, 1),
            (v2.id, 2),
        ]
        assert (everything[2]["name"], everything[2]["archived_at"]) == (FT, read["archived_at"])
        with pytest.raises(BadRequest, match="not a version id"):
            registry.archive(session, "acme", FT)

    hoster = deployments(db_engine, tmp_path)
    with pytest.raises(Conflict, match=f"{v2.id} .* is archived"):
        hoster.request("acme", v2.id)
    deployed, _ = hoster.request("acme", f"{FT}@production")  # an alias deploys its version
    assert (deployed.version_id, deployed.served_model_name) == (v1.id, FT)
    with Session(db_engine, expire_on_commit=False) as session:
        aliases.remove_alias(session, "acme", FT, "production")
        registry.archive(session, "acme", v1.id)  # its deployment goes on
        # Every version archived: the name still reads (its latest), and is not deployed.
        assert registry.get_model(session, "acme", FT)["version_id"] == v2.id
        assert [m["id"] for m in registry.list_models(session, "acme")] == [BASE]
    with pytest.raises(Conflict, match="is archived"):
        hoster.request("acme", FT)
    assert hoster.get("acme", deployed.id).status == "pending"


def test_a_version_an_active_deployment_or_an_alias_holds_is_not_deleted(
    db_session: Session,
) -> None:
    v1, v2 = versions(db_session)
    for status, dep_id in (
        ("ready", "dep-ready"),
        ("pending", "dep-pending"),
        ("stopped", "dep-x"),
    ):
        db_session.add(
            Deployment(
                id=dep_id, tenant="acme", version_id=v1.id, served_model_name=FT, status=status
            )
        )
    db_session.commit()
    aliases.set_alias(db_session, "acme", FT, "production", 1)
    with pytest.raises(Conflict) as refused:
        registry.delete(db_session, "acme", v1.id)
    message = refused.value.message
    assert "deployment dep-ready" in message
    assert "deployment dep-pending" in message
    assert "dep-x" not in message  # a stopped one holds nothing
    assert f"alias {FT}@production" in message
    assert refused.value.details == {
        "deployments": ["dep-pending", "dep-ready"],
        "aliases": [f"{FT}@production"],
    }

    registry.delete(db_session, "acme", v2.id)  # held by nothing
    with pytest.raises(NotFound, match=v2.id):
        registry.get_model(db_session, "acme", v2.id)
    assert registry.resolve(db_session, "acme", FT).id == v1.id
    with pytest.raises(NotFound, match=v2.id):
        registry.delete(db_session, "acme", v2.id)
    with pytest.raises(NotFound, match=v1.id):  # another tenant's
        registry.delete(db_session, "globex", v1.id)


def test_models_show_root_parent_and_the_names_aliases(db_session: Session) -> None:
    v1, _ = versions(db_session)
    aliases.set_alias(db_session, "acme", FT, "production", 1)
    aliases.set_alias(db_session, "acme", FT, "candidate", 2)
    base, tuned = registry.list_models(db_session, "acme")
    assert (base["root"], base["parent"]) == (BASE, None)
    assert (tuned["id"], tuned["version"]) == (FT, 2)
    assert (tuned["root"], tuned["parent"]) == (
        "s3://b/tenants/acme/jobs/ftjob-2/checkpoints/step-1",
        BASE,
    )
    assert tuned["aliases"] == {"candidate": 2, "production": 1}
    assert registry.get_model(db_session, "acme", v1.id)["root"] == v1.checkpoint_uri
    versions(db_session, tenant="globex", count=1)
    assert registry.list_models(db_session, "globex")[1]["aliases"] == {}


# --- over HTTP ----------------------------------------------------------------------------------


@dataclass
class Api:
    http: TestClient
    acme: openai.OpenAI
    globex: openai.OpenAI
    acme_key: str
    published: list[Event]
    v1: ModelVersion
    v2: ModelVersion

    def send(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self.http.request(
            method,
            path,
            headers={"Authorization": f"Bearer {self.acme_key}"},
            **kwargs,
        )
        body: dict[str, Any] = response.json()
        return {"status": response.status_code} | body


@pytest.fixture
def hoster_api(db_engine: Engine) -> Iterator[Api]:
    published: list[Event] = []

    async def publish(event: Event) -> None:
        published.append(event)

    app = FastAPI()
    app.state.db_engine = db_engine
    app.state.hoster = SimpleNamespace(publish=publish)  # the routes here only publish
    app.include_router(api.router)
    app.add_exception_handler(HosterError, api.hoster_error)
    keys = {}
    with Session(db_engine, expire_on_commit=False) as session:
        for tenant in ("acme", "globex"):
            auth.create_tenant(session, tenant_id=tenant, name=tenant)
            keys[tenant] = auth.issue_api_key(session, tenant_id=tenant, name="tests")[1]
        v1, v2 = versions(session)
        versions(session, tenant="globex", count=1)
    with TestClient(app) as http:

        def sdk(tenant: str) -> openai.OpenAI:
            return openai.OpenAI(
                base_url="http://testserver/v1",
                api_key=keys[tenant],
                http_client=http,
                max_retries=0,
            )

        yield Api(http, sdk("acme"), sdk("globex"), keys["acme"], published, v1, v2)


def test_aliases_over_http_with_the_openai_sdk(hoster_api: Api) -> None:
    api_ = hoster_api
    path = f"/v1/models/{FT}/aliases"
    made = api_.send("PUT", f"{path}/production", json={"version": 1})
    assert made == made | {"status": 200, "object": "model.alias", "model": FT, "version": 1}
    assert made["version_id"] == api_.v1.id
    moved = api_.send("PUT", f"{path}/production", json={"version": api_.v2.id})
    assert (moved["status"], moved["version"]) == (200, 2)
    api_.send("PUT", f"{path}/production", json={"version": 2})  # unchanged: nothing published
    changes = [e for e in api_.published if isinstance(e, ModelAliasChanged)]
    assert len(changes) == len(api_.published)
    assert [(e.alias, e.model_version, e.previous_version) for e in changes] == [
        ("production", 1, None),
        ("production", 2, 1),
    ]
    assert [a["alias"] for a in api_.send("GET", path)["data"]] == ["production"]

    found = api_.acme.models.retrieve(f"{FT}@production")
    assert (found.id, found.model_dump()["version_id"]) == (FT, api_.v2.id)
    listed = {m.id: m.model_dump() for m in api_.acme.models.list()}
    assert listed[FT]["aliases"] == {"production": 2}
    assert (listed[FT]["root"], listed[FT]["parent"]) == (api_.v2.checkpoint_uri, BASE)
    assert listed[BASE]["root"] == BASE
    with pytest.raises(openai.NotFoundError, match="no alias 'production'"):
        api_.globex.models.retrieve(f"{FT}@production")  # another tenant's alias
    with pytest.raises(openai.NotFoundError, match="no alias 'staging'"):
        api_.acme.models.retrieve(f"{FT}@staging")

    bad = api_.send("PUT", f"{path}/Prod", json={"version": 1})
    assert bad["status"] == 422
    assert "'Prod' is not an alias" in str(bad["detail"])
    assert api_.send("PUT", f"{path}/prod", json={"version": 0})["status"] == 422
    gone = api_.send("PUT", f"{path}/prod", json={"version": 9})
    assert (gone["status"], gone["detail"]) == (404, f"version: {FT} has no version 9")
    assert api_.send("GET", "/v1/models/ft:nope:x:y/aliases")["status"] == 404

    removed = api_.send("DELETE", f"{path}/production")
    assert removed == {"status": 200, "object": "model.alias", "model": FT, "alias": "production",
                       "deleted": True}  # fmt: skip
    assert api_.send("DELETE", f"{path}/production")["status"] == 404
    last = [e for e in api_.published if isinstance(e, ModelAliasChanged)][-1]
    assert (last.alias, last.model_version, last.previous_version) == ("production", None, 2)


def test_archive_and_delete_over_http_with_the_openai_sdk(hoster_api: Api) -> None:
    api_ = hoster_api
    api_.send("PUT", f"/v1/models/{FT}/aliases/production", json={"version": 1})
    with pytest.raises(openai.ConflictError, match=f"alias {FT}@production") as refused:
        api_.acme.models.delete(api_.v1.id)
    assert refused.value.status_code == 409
    held = api_.send("POST", f"/v1/models/{api_.v1.id}/archive")
    assert (held["status"], held["error"]["aliases"]) == (409, [f"{FT}@production"])

    archived = api_.send("POST", f"/v1/models/{api_.v2.id}/archive")
    assert (archived["status"], archived["version"]) == (200, 2)
    assert isinstance(archived["archived_at"], int)
    assert [m.id for m in api_.acme.models.list()] == [BASE, FT]
    assert api_.acme.models.retrieve(FT).model_dump()["version"] == 1  # latest not archived
    everything = api_.acme.models.list(extra_query={"include_archived": "true"})
    assert [m.id for m in everything] == [BASE, FT, api_.v2.id]
    moved = api_.send("PUT", f"/v1/models/{FT}/aliases/production", json={"version": 2})
    assert moved["status"] == 409
    assert "archived" in str(moved["detail"])

    deleted = api_.acme.models.delete(api_.v2.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (api_.v2.id, True, "model")
    with pytest.raises(openai.NotFoundError, match=api_.v2.id):
        api_.acme.models.retrieve(api_.v2.id)
    with pytest.raises(openai.NotFoundError, match=api_.v1.id):
        api_.globex.models.delete(api_.v1.id)  # another tenant's
    with pytest.raises(openai.UnprocessableEntityError, match="not a version id"):
        api_.acme.models.delete(FT)
