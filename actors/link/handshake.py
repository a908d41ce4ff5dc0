"""The policy side of a connection: the handshake, and manifest changes (SPEC §6.7, §17).

``LinkPolicy.handshake`` runs ``initialize``, ``notifications/initialized``, the
``featureSets/update`` negotiation and ``tools/list`` on a fresh link, naming the step in
``Link.step`` so a server that dies in it is reported with it. The grant the initial
``featureSets/update`` announces is in force from the moment it is sent (host-first): the
server's requests are served under it while the handshake waits for the receipt, which can only
take the grant away. A step that gets no answer (``RequestTimeout``) fails the handshake; an
unanswered ``featureSets/update`` is no receipt, so it never makes the link ready (MCP-only or
not).

``apply_manifest`` diffs a manifest against the one in force and re-applies the policy of a
``ServerConfig`` to the live link (host-first revocation, then ``featureSets/update``); it serves
``mcpl/manifestChanged`` (one announced while the handshake runs is fetched once it is over) and
can serve a new config's masks alike. Declaration mismatches (``protocol.declarations``) are traced
once per handshake and per manifest change; a call refused because its feature set's ``uses``
lacks the capability it exercises is traced as one too (``note_refused_use``), once per (set,
capability) and link.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import trio

from actors.config import ServerConfig
from actors.errors import NotConnected
from actors.version import installed_version
from protocol import grants, mcpl
from protocol.declarations import (
    NOT_ADVERTISED,
    TAGGED_CAPABILITIES,
    UNKNOWN_CAPABILITY,
    UNLISTED_USE,
    Mismatch,
    declaration_mismatches,
    refused_use,
)
from protocol.errors import METHOD_NOT_FOUND, RpcError
from protocol.manifest import ManifestError, manifest_digest

from .state import MANIFEST_FETCHES, MANIFEST_WINDOW_S, Link, LinkOwner, RequestTimeout

MAX_TOOLS = 1000
MAX_TOOL_PAGES = 20
_REVISION = re.compile(r"sha256:[A-Za-z0-9_-]{43}")
_DOMAINS = frozenset({"capabilities", "featureSets", "tagOntology"})


class LinkPolicy:
    def __init__(self, owner: LinkOwner) -> None:
        self.owner = owner
        self.version = installed_version() or "0"

    # -- the handshake ---------------------------------------------------------------------------
    async def handshake(self, link: Link) -> Mapping[str, Any]:
        """Negotiate a fresh link up to its tools; returns the server's ``serverInfo``."""
        owner = self.owner
        link.step = "initialize"
        init = await owner.request(link, "initialize", mcpl.initialize_params(self.version))
        # notifications/initialized is always the very next message we send.
        await owner.notify(link, "notifications/initialized", None)
        caps = init.get("capabilities") if isinstance(init, Mapping) else None
        caps = caps if isinstance(caps, Mapping) else {}
        experimental = caps.get("experimental")
        manifest = experimental.get("mcpl") if isinstance(experimental, Mapping) else None
        info = init.get("serverInfo") if isinstance(init, Mapping) else None
        if isinstance(manifest, Mapping):
            link.step = "featureSets/update"
            await self.negotiate(link, manifest, caps)
        else:
            link.mcp_only = True
            link.decide()  # MCP-only is the policy: MCPL calls get -32601 from now on
            owner.trace("mcp-only", reason="the server sent no experimental.mcpl")
        # An MCP-only server keeps its tools; an MCPL server's tools need the ``tools`` grant.
        if caps.get("tools") is not None and (link.mcp_only or "tools" in link.grant):
            link.step = "tools/list"
            await self.list_tools(link, handshake=True)
        link.step = None
        return dict(info) if isinstance(info, Mapping) else {}

    async def negotiate(
        self, link: Link, manifest: Mapping[str, Any], caps: Mapping[str, Any]
    ) -> None:
        owner, cfg = self.owner, self.owner.cfg
        advertised = mcpl.advertised_paths(manifest, caps)
        declared = mcpl.declared_feature_sets(manifest)
        grant = cfg.grant_for(advertised)
        state = cfg.feature_sets_for(declared.sets, grant)
        allowed = cfg.allow_unlisted_uses
        found = declaration_mismatches(manifest, advertised, state, grant, allowed)
        mismatched = self.report_declarations(found)
        params = grants.update_params(grant, state)
        link.manifest = manifest
        link.mcp_caps = caps
        link.feature_sets = declared.sets
        link.outside_sets = frozenset(allowed) & grant
        link.policy = policy_report(advertised, grant, state, found, link.outside_sets)
        # Host-first (SPEC §6.7): the grant is the host's own decision, in force from the moment
        # its update is sent. The server's requests are judged under it at once, never after
        # its receipt: a server that waits on its own request before it reads this update is
        # answered, so the host never needs the server's answer while the server waits on it.
        # The receipt is testimony: it may take the grant away (MCP-only, close), never widen it.
        link.grant = grant
        link.enabled_sets = state.enabled
        link.decide()  # in the step that queues the update (no checkpoint in between)
        try:
            result = await owner.request(link, "featureSets/update", params)
        except RpcError as exc:
            if exc.code == METHOD_NOT_FOUND:
                await owner.notify(link, "featureSets/update", params)
                owner.diagnostic(
                    "featureSets/update request refused (-32601); sent the notification form"
                )
                receipt = mcpl.Receipt(ready=True)
            else:
                receipt = mcpl.Receipt(
                    ready=True, mcp_only=True, note=f"featureSets/update failed: {exc}"
                )
        else:  # no answer (RequestTimeout) fails the handshake: it is no receipt
            receipt = mcpl.read_receipt(result)
        if receipt.note:
            owner.diagnostic(receipt.note)
        if receipt.close or receipt.mcp_only:  # the server does not take part: nothing is granted
            link.grant = frozenset()
            link.enabled_sets = frozenset()
        if receipt.close:
            link.close(receipt.note)
            raise NotConnected(receipt.note)
        if receipt.mcp_only:
            link.mcp_only = True
            owner.trace("mcp-only", reason=receipt.note)
            return
        for status in state.statuses.values():
            if not status.enabled and status.name not in mismatched:
                owner.diagnostic(f"feature set {status.name} not enabled: {status.reason}")

    def report_declarations(self, found: Sequence[Mismatch]) -> frozenset[str]:
        """Trace each declaration mismatch (one ``declaration-mismatch`` event each); returns
        the sets that cannot be enabled because of one."""
        unusable: set[str] = set()
        for m in found:
            trace_mismatch(self.owner, m)
            if m.feature_set is not None and m.problem in (NOT_ADVERTISED, UNKNOWN_CAPABILITY):
                unusable.add(m.feature_set)
        return frozenset(unusable)

    async def list_tools(self, link: Link, *, handshake: bool = False) -> None:
        """Fetch the server's tools; a failure keeps what was listed, except that a handshake's
        listing that gets no answer fails the handshake (``RequestTimeout`` is raised)."""
        owner = self.owner
        tools: list[Mapping[str, Any]] = []
        cursor: Any = None
        for _ in range(MAX_TOOL_PAGES):
            try:
                result = await owner.request(
                    link, "tools/list", {"cursor": cursor} if cursor else {}
                )
            except (RpcError, RequestTimeout) as exc:
                if handshake and isinstance(exc, RequestTimeout):
                    raise
                owner.diagnostic(f"tools/list failed: {exc}")
                break
            page = result.get("tools") if isinstance(result, Mapping) else None
            for tool in page if isinstance(page, list) else []:
                if (
                    isinstance(tool, Mapping)
                    and isinstance(tool.get("name"), str)
                    and len(tools) < MAX_TOOLS
                ):
                    tools.append(tool)
            cursor = result.get("nextCursor") if isinstance(result, Mapping) else None
            if not cursor:
                break
        before = [str(t["name"]) for t in link.tools]
        link.tools = tuple(tools)
        owner.publish_status()
        names = [str(t["name"]) for t in tools]
        if not handshake and names != before:
            added = [n for n in names if n not in before]
            removed = [n for n in before if n not in names]
            owner.trace("tools-changed", tools=names, added=added, removed=removed)

    # -- manifest changes (SPEC §17) ---------------------------------------------------------------
    def on_manifest_changed(self, link: Link, params: Any) -> None:
        """An announcement only: fetch the manifest (rate-limited) and diff it ourselves."""
        owner = self.owner
        if not (
            isinstance(params, Mapping)
            and set(params) == {"revision", "domains"}
            and isinstance(params["revision"], str)
            and _REVISION.fullmatch(params["revision"])
            and isinstance(params["domains"], list)
            and params["domains"]
            and all(d in _DOMAINS for d in params["domains"])
        ):
            owner.diagnostic("malformed mcpl/manifestChanged ignored")
            return
        if link.mcp_only or not link.decided:
            owner.diagnostic("mcpl/manifestChanged before the policy is in force; ignored")
            return
        if not link.ready:  # the handshake still runs: fetched once it is over
            link.refetch = True
            return
        self.fetch_manifest(link)

    def fetch_manifest(self, link: Link) -> None:
        """Fetch the manifest now (rate-limited), or once more after the running fetch."""
        if link.fetching:
            link.refetch = True  # coalesced into one more fetch after the running one
            return
        link.refetch = False
        if not self._may_fetch(link):
            return
        link.fetching = True
        assert link.nursery is not None
        self.owner.work.inc()
        link.nursery.start_soon(self._refresh_manifest, link)

    def _may_fetch(self, link: Link) -> bool:
        now = trio.current_time()
        if len(link.fetches) == MANIFEST_FETCHES and now - link.fetches[0] < MANIFEST_WINDOW_S:
            self.owner.diagnostic(
                f"mcpl/manifestChanged more than {MANIFEST_FETCHES} times in "
                f"{MANIFEST_WINDOW_S:g}s: dropped (a server defect)"
            )
            return False
        link.fetches.append(now)
        return True

    async def _refresh_manifest(self, link: Link) -> None:
        owner = self.owner
        try:
            while True:
                try:
                    fetched = await owner.request(link, "mcpl/manifest", {})
                except (RpcError, RequestTimeout) as exc:
                    owner.diagnostic(
                        f"the server announced a manifest change, but mcpl/manifest failed: {exc}"
                    )
                    return
                if isinstance(fetched, Mapping):
                    await self.apply_manifest(link, fetched)
                else:
                    owner.diagnostic(
                        "mcpl/manifest did not answer an object; the manifest in force stays"
                    )
                if not link.refetch or not self._may_fetch(link):
                    return
                link.refetch = False
        except NotConnected:
            pass
        finally:
            link.fetching = False
            link.refetch = False
            owner.work.dec()

    async def apply_manifest(
        self,
        link: Link,
        manifest: Mapping[str, Any],
        cfg: ServerConfig | None = None,
        *,
        by_operator: bool = False,
    ) -> None:
        """Diff ``manifest`` against the one in force and apply it under ``cfg``'s policy (the
        connection's own config by default; a reloaded config re-applies its masks this way,
        with the manifest in force).

        Removals are revoked at once, host-first, before the update is sent. Additions are never
        granted on the server's word: only an explicit ``enabled_capabilities`` pattern can grant
        them, and then only once the receipt arrives; otherwise they wait for the operator (a
        config reload, ``by_operator``, grants them).
        """
        owner = self.owner
        cfg = cfg or owner.cfg
        before_grant, before_sets = link.grant, link.enabled_sets
        advertised = mcpl.advertised_paths(manifest, link.mcp_caps)
        declared = mcpl.declared_feature_sets(manifest)
        wanted = cfg.grant_for(advertised)
        added = wanted - before_grant
        pending = added if cfg.enabled_capabilities is None and not by_operator else frozenset()
        target = wanted - pending
        reduced = before_grant & target
        state = cfg.feature_sets_for(declared.sets, target)
        found = declaration_mismatches(manifest, advertised, state, target, cfg.allow_unlisted_uses)
        if manifest is not link.manifest:
            self.report_declarations(found)
        # host-first: what the server no longer offers (or policy no longer allows) is gone now
        link.grant = reduced
        link.manifest = manifest
        link.feature_sets = declared.sets
        link.outside_sets = frozenset(cfg.allow_unlisted_uses) & reduced
        link.enabled_sets = cfg.feature_sets_for(declared.sets, reduced).enabled
        params = grants.update_params(target, state)
        accepted = False
        try:
            receipt = mcpl.read_receipt(await owner.request(link, "featureSets/update", params))
            accepted = receipt.ready and not receipt.mcp_only
            if receipt.close:
                link.close(receipt.note)
        except RpcError as exc:
            if exc.code == METHOD_NOT_FOUND:
                await owner.notify(link, "featureSets/update", params)
                accepted = True
            else:
                owner.diagnostic(f"featureSets/update after a manifest change failed: {exc}")
        except RequestTimeout:
            owner.diagnostic("featureSets/update after a manifest change got no receipt")
        if accepted:  # expansions activate only with the receipt
            link.grant = target
            link.enabled_sets = state.enabled
        impacts = manifest_impacts(
            before_grant,
            link.grant,
            pending,
            added - pending,
            before_sets,
            link.enabled_sets,
            accepted,
        )
        try:
            digest = manifest_digest(manifest)
        except ManifestError as exc:
            digest = f"refused ({exc.code})"
        link.policy = policy_report(advertised, link.grant, state, found)
        owner.publish_status()
        owner.trace("manifest-changed", digest=digest, impacts=impacts, grant=sorted(link.grant))


def manifest_impacts(
    before: frozenset[str],
    after: frozenset[str],
    pending: frozenset[str],
    configured: frozenset[str],
    sets_before: frozenset[str],
    sets_after: frozenset[str],
    accepted: bool,
) -> list[dict[str, str]]:
    """The receipt of one manifest change: each impact with its disposition (SPEC §17)."""
    impacts = [
        {"impact": "capability-revoked", "subject": p, "disposition": "applied"}
        for p in sorted(before - after - configured)
    ]
    impacts += [
        {"impact": "capability-expansion-pending", "subject": p, "disposition": "decision-needed"}
        for p in sorted(pending)
    ]
    impacts += [
        {
            "impact": "capability-expansion-pending",
            "subject": p,
            "disposition": "applied" if accepted else "informational",
        }
        for p in sorted(configured)
    ]
    impacts += [
        {"impact": "feature-degraded", "subject": n, "disposition": "applied"}
        for n in sorted(sets_before - sets_after)
    ]
    impacts += [
        {"impact": "feature-restored", "subject": n, "disposition": "applied"}
        for n in sorted(sets_after - sets_before)
    ]
    return impacts


def trace_mismatch(owner: LinkOwner, m: Mismatch) -> None:
    owner.trace(
        "declaration-mismatch",
        problem=m.problem,
        feature_set=m.feature_set,
        capability=m.capability,
        feature_sets=list(m.feature_sets),
        text=m.text,
    )


def note_refused_use(owner: LinkOwner, link: Link, method: str, error: RpcError | None) -> None:
    """After a refusal: when it refused a capability its feature set's ``uses`` does not list,
    trace that declaration mismatch, once per (set, capability) on this link, within a cap."""
    m = refused_use(method, error.code, error.data) if error is not None else None
    if m is None:
        return
    link.noted_uses, line = link.noted_uses.note(m)
    if line is not None:
        trace_mismatch(owner, line)


def policy_report(
    advertised: frozenset[str],
    grant: frozenset[str],
    state: grants.FeatureSetState,
    mismatches: Sequence[Mismatch] = (),
    outside_sets: Collection[str] = (),
) -> dict[str, Any]:
    """What a server advertised, what the host grants, each feature set's status, and the
    declaration mismatches found (their lines). An enabled set that an :data:`UNLISTED_USE`
    line names is reported with the capability its calls are refused."""
    lacking: dict[str, list[str]] = {}
    for m in mismatches:
        if m.problem == UNLISTED_USE and m.capability is not None:
            for name in m.feature_sets:
                lacking.setdefault(name, []).append(m.capability)

    def status(name: str, st: grants.FeatureSetStatus) -> str:
        if st.enabled:
            caps = lacking.get(name)
            if not caps:
                return "enabled"
            refused = "; ".join(f"{c}: {TAGGED_CAPABILITIES[c]} naming it is refused" for c in caps)
            return f"enabled, but its uses lack {refused}"
        return (st.reason or "not enabled") + (f" ({', '.join(st.missing)})" if st.missing else "")

    return {
        "advertised": sorted(advertised),
        "granted": sorted(grant),
        "denied": sorted(advertised - grant),
        "feature_sets": {name: status(name, st) for name, st in sorted(state.statuses.items())},
        "mismatches": [m.text for m in mismatches],
        # what the operator lets the server use outside the sets that list it
        "outside_sets": sorted(outside_sets),
    }
