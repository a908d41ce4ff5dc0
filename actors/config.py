"""Configuration: TOML (or the dict ``tomllib`` returns) → frozen, validated records.

Every problem is one line naming the key and the fix; ``load_config`` reports them all at once.
Relative paths resolve from the config file's folder.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
import zoneinfo
from collections.abc import Collection, Mapping
from datetime import UTC, tzinfo
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

from protocol import grants
from protocol.addresses import address_problem
from protocol.addressing import MAX_ALIAS, MAX_ALIASES
from protocol.declarations import TAGGED_CAPABILITIES
from protocol.gate import PRESETS, GateConfig, GateConfigError, parse_gate, preset
from protocol.mcpl import FeatureSet
from protocol.prices import PRICE_KEYS, Price
from protocol.redact import Redactor
from protocol.uri import McplUriError, parse_endpoint
from store.dbapi import dsn_password, is_dsn

from .errors import ConfigError

PROSE_MODES = ("locus", "explicit", "hybrid", "disabled")
REQUEST_TIMEOUT_S = 60.0
#: Tokens a reply may take when the agent sets no ``max_tokens``, and the most it may set.
DEFAULT_MAX_TOKENS = 1024
MAX_TOKENS_CAP = 1_000_000
#: The highest ``temperature`` each provider takes (0 is the lowest everywhere).
MAX_TEMPERATURE = {"anthropic": 1.0, "openai": 2.0, "scripted": 2.0}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
_AGENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")  # e.g. __proto__ too


@attrs.frozen(kw_only=True)
class ServerConfig:
    id: str
    command: tuple[str, ...] | None = None
    url: str | None = None  # as configured: mcpl://, wss:// or ws://
    endpoint: str | None = None  # the address dialled (RFC-004 resolved transport)
    env: Mapping[str, str] = attrs.field(factory=dict)
    token: str | None = attrs.field(default=None, repr=False)
    request_timeout_s: float = REQUEST_TIMEOUT_S
    max_line_bytes: int = 4_194_304
    enabled_capabilities: tuple[str, ...] | None = None
    disabled_capabilities: tuple[str, ...] = ()
    enabled_feature_sets: tuple[str, ...] | None = None
    disabled_feature_sets: tuple[str, ...] = ()
    eager_limit_bytes: int = 262_144
    fetch_ceiling_bytes: int = 268_435_456
    fetch_budget_bytes: int = 1_073_741_824
    hook_timeout_s: float = 5.0
    inference_requests_per_hour: int = 60
    # feature-set name pattern -> model spec, for this server's inference/request
    inference_models: Mapping[str, str] = attrs.field(factory=dict)
    # publish plain speech to channels that declare no publish target (RFC-011 legacy form)
    publish_undeclared: bool = False
    #: capabilities the server may use outside the feature sets that list them in their uses
    #: (an operator's choice for a server whose manifest forgot them, such as heartbeat-mcpl's
    #: pushEvents); only those it advertises and the host grants
    allow_unlisted_uses: tuple[str, ...] = ()
    cwd: Path | None = None

    def inference_model_for(self, feature_set: str) -> str | None:
        """The model spec routed for ``feature_set``: an exact name first, then the first
        matching pattern in configured order; None when nothing matches."""
        if feature_set in self.inference_models:
            return self.inference_models[feature_set]
        for pattern, spec in self.inference_models.items():
            if grants.name_matches(pattern, feature_set):
                return spec
        return None

    def grant_for(self, advertised: Collection[str]) -> frozenset[str]:
        """What this server is granted of what it advertises, under the capability masks."""
        return grants.effective_grant(
            advertised, self.enabled_capabilities, self.disabled_capabilities
        )

    def feature_sets_for(
        self, declared: Mapping[str, FeatureSet], grant: Collection[str]
    ) -> grants.FeatureSetState:
        """Each declared feature set's status under ``grant`` and the feature-set masks."""
        return grants.derive_feature_sets(
            declared, grant, self.enabled_feature_sets, self.disabled_feature_sets
        )


@attrs.frozen(kw_only=True)
class AgentConfig:
    name: str
    model: str
    system_prompt: str | None = None
    servers: tuple[str, ...] | None = None
    prose_mode: str = "locus"
    gate: Path | None = None
    #: the gate file's policies as read with the config (None: read them when the agent starts)
    gate_policy: GateConfig | None = attrs.field(default=None, eq=False, repr=False)
    #: the built-in gate preset named by ``gate`` (such as ``"community"``); None: a file or none
    gate_preset: str | None = None
    #: other names that address the agent in a message (besides its own)
    aliases: tuple[str, ...] = ()
    context_tokens: int = 60_000
    max_tokens: int = DEFAULT_MAX_TOKENS  # the most a reply may take
    temperature: float | None = None  # None: the provider's default
    base_url: str | None = None  # the model provider's endpoint; None: its own
    api_key_env: str | None = None  # the variable holding the provider's key
    summary_model: str | None = None  # the model folding old context; None: ``model``
    images: bool = True  # False: the model reads text only (images become a short note)
    #: the most tokens (all kinds) the agent may use a UTC day; None: no budget
    budget_daily_tokens: int | None = None
    #: the most the agent's model calls may cost a UTC day, in US dollars; None: no budget
    budget_daily_usd: float | None = None

    def hears(self, server_id: str) -> bool:
        return self.servers is None or server_id in self.servers


@attrs.frozen(kw_only=True)
class HostConfig:
    data_dir: Path
    servers: tuple[ServerConfig, ...]
    agents: tuple[AgentConfig, ...]
    base_dir: Path
    inference_model: str | None = None  # the model for inference requests no route names
    web: str | None = None  # the operator console's address; None: no console
    web_token_env: str | None = None  # the variable holding the console's access token
    #: ``[prices."model-name"]``: prices over the built-in table (:mod:`protocol.prices`)
    prices: Mapping[str, Price] = attrs.field(factory=dict)
    #: the IANA time zone whose calendar days the daily budgets count (``[host] timezone``)
    timezone: str = "UTC"
    #: the most tokens all agents together may use a day; None: no host-wide budget
    budget_daily_tokens: int | None = None
    #: the most all agents' model calls may cost a day, in US dollars; None: no such budget
    budget_daily_usd: float | None = None
    #: this host's id in a fleet (``[host] host_id``); None: the one kept in the data dir
    host_id: str | None = None
    #: ``[host] store`` (or the variable ``store_env`` names): the PostgreSQL DSN the store is
    #: on; None: the embedded SQLite store in ``data_dir``. It may hold a password: never print
    #: it (:func:`host_secrets` has it, :func:`store.dbapi.describe` names it without one).
    store: str | None = attrs.field(default=None, repr=False)
    #: the environment variable the DSN was read from (``[host] store_env``), if any
    store_env: str | None = None

    @property
    def store_location(self) -> Path | str:
        """Where the store is: the PostgreSQL DSN, or the SQLite file in ``data_dir``."""
        return self.store if self.store is not None else self.data_dir / "store.sqlite3"

    @property
    def tz(self) -> tzinfo:
        """The budgets' time zone (read when the config was checked; cached since)."""
        return zone(self.timezone)

    def server(self, server_id: str) -> ServerConfig | None:
        return next((s for s in self.servers if s.id == server_id), None)

    def publish_undeclared(self, server_id: str) -> bool:
        """Whether plain speech may go to this server's channels that declare no target."""
        server = self.server(server_id)
        return server is not None and server.publish_undeclared

    def request_timeout(self, server_id: str) -> float:
        """The server's ``request_timeout_s`` (the default for a server not configured)."""
        server = self.server(server_id)
        return server.request_timeout_s if server is not None else REQUEST_TIMEOUT_S


class ConfigErrors(ConfigError):
    """Every problem of a config at once: ``problems`` is the list of one-line problems, each
    naming its key; ``partial`` the config of the parts without one (None when the file could
    not be read)."""

    def __init__(self, problems: list[str], *, partial: HostConfig | None = None) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems
        #: the config of the parts that had no problem (a server or an agent with one is left
        #: out), for checks that go on past these problems; None when the file was not read
        self.partial = partial


def read_config_source(
    source: str | os.PathLike[str] | Mapping[str, Any],
) -> tuple[dict[str, Any], Path]:
    if isinstance(source, Mapping):
        return dict(source), Path.cwd()
    path = Path(source)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh), path.resolve().parent
    except FileNotFoundError:
        raise ConfigErrors([f"{path}: no such file; give the path of a TOML config"]) from None
    except IsADirectoryError:
        raise ConfigErrors([f"{path}: is a folder; give the path of a TOML config file"]) from None
    except OSError as exc:
        raise ConfigErrors([f"{path}: cannot read it ({exc.strerror or exc})"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigErrors(
            [f"{path}: not UTF-8 text (byte {exc.start}); save the config as UTF-8"]
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigErrors([f"{path}: not valid TOML ({exc}); fix the syntax"]) from None
    except RecursionError:
        # tomllib recurses once per nested array or inline table: the file's, not the host's,
        # problem (the parse is linear in the text up to the interpreter's recursion limit)
        raise ConfigErrors(
            [f"{path}: nested too deeply (arrays or inline tables inside each other); flatten it"]
        ) from None


def unknown_key(where: str, key: str, known: Collection[str], fallback: str) -> str:
    """The problem line for an unknown key: the closest known key when one is close enough,
    else ``fallback`` (what the table takes)."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else fallback
    return f"{where}.{key}: unknown key; {hint}" if where else f"{key}: unknown key; {hint}"


_HOST_KEYS = (
    "data_dir",
    "inference_model",
    "web",
    "web_token_env",
    "timezone",
    "budget_daily_tokens",
    "budget_daily_usd",
    "host_id",
    "store",
    "store_env",
)
_TOP_KEYS = ("host", "servers", "agents", "prices")


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any], *, data_dir: Path | None = None
) -> HostConfig:
    """The checked config; every problem found is in the one ``ConfigErrors`` raised.

    ``data_dir`` (the command line's ``--data-dir``, relative to the current folder) is used when
    the config sets no ``host.data_dir``; a config that sets one too is a problem, so neither
    silently wins.
    """
    raw, base = read_config_source(source)
    problems: list[str] = []
    host = raw.get("host", {})
    if not isinstance(host, Mapping):
        problems.append("host: must be a table ([host])")
        host = {}
    for key in host:
        if key not in _HOST_KEYS:
            problems.append(
                unknown_key("host", key, _HOST_KEYS, "[host] takes " + _keys(_HOST_KEYS))
            )
    inference_model = _model_spec(
        "host.inference_model", host.get("inference_model"), base, problems
    )
    timezone = host.get("timezone", "UTC")
    tz_problem = zone_problem(timezone)
    if tz_problem is not None:
        problems.append(f"host.timezone: {tz_problem}")
        timezone = "UTC"
    host_tokens = _number(
        "host.budget_daily_tokens", host.get("budget_daily_tokens"), None, problems, integer=True
    )
    host_usd = _number("host.budget_daily_usd", host.get("budget_daily_usd"), None, problems)
    host_id = host.get("host_id")
    if host_id is not None and not (isinstance(host_id, str) and _ID.fullmatch(host_id)):
        problems.append("host.host_id: letters, digits, '_', '.', '-', at most 64 characters")
        host_id = None
    web_problem = address_problem(host.get("web"), host.get("web_token_env"))
    if web_problem is not None:
        problems.append(web_problem)
    store_dsn = store_of(host.get("store"), host.get("store_env"), problems)
    configured = host.get("data_dir")
    if data_dir is not None and configured is not None:
        problems.append(
            f"host.data_dir: the config sets it ({configured!r}) and so does --data-dir "
            f"({str(data_dir)!r}); give only one"
        )
    data_root, data_dir_value = (Path.cwd(), str(data_dir)) if data_dir else (base, configured)
    if data_dir_value is None:
        data_dir_value = "./mcplive-data"
    if not isinstance(data_dir_value, str) or not data_dir_value:
        problems.append("host.data_dir: must be a path string")
        data_dir_value = "./mcplive-data"
    for key in raw:
        if key not in _TOP_KEYS:
            problems.append(
                unknown_key("", key, _TOP_KEYS, "use [host], [[servers]], [[agents]] or [prices]")
            )
    prices = prices_of(raw.get("prices", {}), problems)
    servers = [
        _server(i, s, base, problems) for i, s in enumerate(_tables(raw, "servers", problems))
    ]
    agent_tables = _tables(raw, "agents", problems)
    agents = [_agent(i, a, base, problems) for i, a in enumerate(agent_tables)]
    seen: set[str] = set()
    for s in servers:
        if s is not None and s.id in seen:
            problems.append(f"servers.id: {s.id!r} is used twice; give each server its own id")
        if s is not None:
            seen.add(s.id)
    names: set[str] = set()
    for a in agents:
        if a is None:
            continue
        if a.name in names:
            problems.append(f"agents.name: {a.name!r} is used twice; give each agent its own name")
        names.add(a.name)
    # From the tables, so an agent with other problems still has its server names checked.
    for i, table in enumerate(agent_tables):
        refs = table.get("servers")
        if isinstance(refs, list):
            for sid in refs:
                if isinstance(sid, str) and sid not in seen:
                    where = _where("agents", table.get("name"), i)
                    problems.append(f"{where}.servers: no server has id {sid!r}")
    if not agents and not problems:
        problems.append("agents: no [[agents]] configured; add at least one agent")
    web_ok = web_problem is None
    cfg = HostConfig(
        data_dir=(data_root / data_dir_value).resolve(),
        servers=tuple(s for s in servers if s is not None),
        agents=tuple(a for a in agents if a is not None),
        base_dir=base,
        inference_model=inference_model,
        web=host.get("web") if web_ok else None,
        web_token_env=host.get("web_token_env") if web_ok else None,
        prices=prices,
        timezone=timezone,
        budget_daily_tokens=host_tokens,
        budget_daily_usd=host_usd,
        host_id=host_id,
        store=store_dsn,
        store_env=host.get("store_env") if isinstance(host.get("store_env"), str) else None,
    )
    if problems:
        raise ConfigErrors(problems, partial=cfg)
    return cfg


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DSN_EXAMPLE = "'postgresql://USER@HOST:PORT/DATABASE'"


def store_of(value: Any, env: Any, problems: list[str]) -> str | None:
    """The PostgreSQL DSN of ``[host] store`` or of the variable ``store_env`` names (None:
    the embedded store); each problem is one line. A DSN is never put in a problem line."""
    if value is not None and env is not None:
        problems.append("host.store, host.store_env: give only one (store_env names the variable)")
        return None
    where = "host.store"
    if env is not None:
        where = "host.store_env"
        if not isinstance(env, str) or not _ENV_NAME.fullmatch(env):
            problems.append(f"{where}: must be the name of an environment variable")
            return None
        value = os.environ.get(env)
        if not value:
            problems.append(f"{where}: environment variable {env} is not set")
            return None
        where = f"{where}: the variable {env}"
    if value is None:
        return None
    problem = dsn_problem(value)
    if problem is not None:
        problems.append(f"{where}: {problem}")
        return None
    assert isinstance(value, str)
    return value


def dsn_problem(value: Any) -> str | None:
    """Why ``value`` is no PostgreSQL DSN the host can use, as one line; None when it is."""
    if not isinstance(value, str) or not is_dsn(value):
        return (
            f"must be a PostgreSQL DSN ({_DSN_EXAMPLE}); leave it out for the embedded store "
            "in data_dir"
        )
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - reading it checks it
    except ValueError as exc:
        return f"not a valid DSN ({exc}); the form is {_DSN_EXAMPLE}"
    if not parts.path.strip("/"):
        return f"names no database; the form is {_DSN_EXAMPLE}"
    return None


def zone(name: str) -> tzinfo:
    """The time zone ``name`` (``UTC`` is :data:`datetime.UTC`); zoneinfo caches each zone read."""
    return UTC if name == "UTC" else zoneinfo.ZoneInfo(name)


def zone_problem(name: Any) -> str | None:
    """Why ``name`` is not a time zone the host can count days in, or None."""
    if not isinstance(name, str) or not name:
        return "must be an IANA time zone name such as 'UTC' or 'Europe/Berlin'"
    try:
        zone(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return f"{name!r} is not a known time zone; use an IANA name such as 'Europe/Berlin'"
    return None


def prices_of(raw: Any, problems: list[str]) -> dict[str, Price]:
    """``[prices."model-name"]`` tables, each with ``input``, ``output``, ``cache_read`` and
    ``cache_write`` in US dollars per million tokens."""
    if not isinstance(raw, Mapping):
        problems.append('prices: must be a table of models ([prices."model-name"])')
        return {}
    found: dict[str, Price] = {}
    for model, figures in raw.items():
        where = f'prices."{model}"'
        if not isinstance(figures, Mapping):
            problems.append(f"{where}: must be a table with {', '.join(PRICE_KEYS)}")
            continue
        try:
            found[model] = Price.of(figures)
        except ValueError as exc:
            problems.append(f"{where}: {exc} (USD per million tokens: {', '.join(PRICE_KEYS)})")
    return found


def _keys(keys: Collection[str]) -> str:
    names = sorted(keys)
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


#: The files a host writes in its data_dir (the store, its WAL files, the lock).
_DATA_FILES = ("store.sqlite3", "store.sqlite3-wal", "store.sqlite3-shm", "mcplive.lock")


def data_dir_problem(data_dir: Path) -> str | None:
    """Why a host could not keep its data in ``data_dir``, as one line; None when it can. Looks
    without creating or changing anything."""
    if data_dir.exists() and not data_dir.is_dir():
        return f"data_dir {data_dir}: is a file, not a folder; give a folder (made when missing)"
    existing = data_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"data_dir {data_dir}: {existing} is a file, so the folder cannot be made there"
    if not _writable(existing):
        what = "it is" if existing == data_dir else f"{existing} is"
        return (
            f"data_dir {data_dir}: {what} not writable by this user; give a folder this user "
            "may write to, or change its permissions"
        )
    for name in _DATA_FILES:
        path = data_dir / name
        if path.exists() and not _writable(path):
            return f"data_dir {data_dir}: {path} is not writable by this user"
    return None


def _writable(path: Path) -> bool:
    mode = os.W_OK | (os.X_OK if path.is_dir() else 0)
    return os.access(path, mode, effective_ids=os.access in os.supports_effective_ids)


_MODEL_SPEC = re.compile(r"(scripted|anthropic|openai):.+")
MODEL_SPECS = "'scripted:PATH', 'anthropic:MODEL' or 'openai:MODEL'"
#: The environment variable holding each provider's credential.
PROVIDER_KEYS = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
#: Environment variables holding model API keys the host reads.
MODEL_KEY_VARIABLES = tuple(PROVIDER_KEYS.values())
#: The providers' own public endpoints (host names): a ``base_url`` naming one needs an
#: ``api_key_env``, since an agent with a ``base_url`` sends no key otherwise.
PUBLIC_ENDPOINTS = {"api.anthropic.com": "anthropic", "api.openai.com": "openai"}


def host_secrets(cfg: HostConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every credential the host is configured with: each server's ``token`` (also when read
    from ``token_env``), the model API keys it reads from the environment, and any other
    ``*_env`` credential variable an agent or the host names."""
    env = os.environ if environ is None else environ
    secrets: list[str | None] = [s.token for s in cfg.servers]
    names: list[str] = list(MODEL_KEY_VARIABLES)
    for holder in (cfg, *cfg.agents):
        for attribute in ("api_key_env", "web_token_env"):
            name = getattr(holder, attribute, None)
            if isinstance(name, str):
                names.append(name)
    secrets += [env.get(name) for name in names]
    if cfg.store is not None:
        secrets.append(dsn_password(cfg.store))
    return [s for s in secrets if s]


def host_redactor(cfg: HostConfig, environ: Mapping[str, str] | None = None) -> Redactor:
    """The one redactor of everything the host prints or writes for operators."""
    return Redactor(host_secrets(cfg, environ))


def key_variable(provider: str, base_url: str | None, api_key_env: str | None) -> str | None:
    """The environment variable a provider's key is read from; None when no key is sent.

    ``api_key_env`` names it whatever the endpoint; an endpoint of the operator's own
    (``base_url``) without one gets no key, so the provider's default variable (e.g.
    ``OPENAI_API_KEY``) never goes to an address the config names; with neither, the default.
    """
    if api_key_env is not None:
        return api_key_env
    if base_url is not None:
        return None
    return PROVIDER_KEYS.get(provider)


def _model_spec(
    where: str,
    value: Any,
    base: Path,
    problems: list[str],
    *,
    base_url: str | None = None,
    api_key_env: str | None = None,
    check_key: bool = True,
) -> str | None:
    """A checked model spec (a scripted model's path made absolute), or None. A provider whose
    credential variable is unset (or empty) is a problem here, as a missing ``token_env`` is
    (unless ``check_key`` is false: the endpoint keys had problems of their own)."""
    if value is None:
        return None
    if not isinstance(value, str) or not _MODEL_SPEC.fullmatch(value):
        problems.append(f"{where}: must be {MODEL_SPECS}")
        return None
    variable = key_variable(value.partition(":")[0], base_url, api_key_env)
    if check_key and variable is not None and not os.environ.get(variable):
        problems.append(
            f"{where}: {value} needs an API key; environment variable {variable} is not set"
        )
        return None
    if value.startswith("scripted:"):
        path = (base / value.removeprefix("scripted:")).resolve()
        if not path.is_file():
            problems.append(f"{where}: scripted model file {path} does not exist")
            return None
        return f"scripted:{path}"
    return value


def _where(kind: str, key: Any, i: int) -> str:
    return f"{kind}[{key if isinstance(key, str) and key else i}]"


def _tables(raw: Mapping[str, Any], key: str, problems: list[str]) -> list[Mapping[str, Any]]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        problems.append(f"{key}: must be an array of tables ([[{key}]])")
        return []
    return value


def _str_list(where: str, value: Any, problems: list[str]) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}: must be a list of strings")
        return None
    return tuple(value)


def _number(
    where: str, value: Any, default: float | None, problems: list[str], *, integer: bool = False
) -> Any:
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if not ok or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive finite number"
        problems.append(f"{where}: must be {kind}")
        return default
    return value


# ``cwd`` is set by the host (the config file's folder), not by the config.
_SERVER_KEYS = ({f.name for f in attrs.fields(ServerConfig)} - {"cwd", "endpoint"}) | {"token_env"}


def _server(i: int, s: Mapping[str, Any], base: Path, problems: list[str]) -> ServerConfig | None:
    sid = s.get("id")
    where = _where("servers", sid, i)
    valid = isinstance(sid, str) and bool(_ID.fullmatch(sid)) and "--" not in sid
    if not valid:
        problems.append(
            f"{where}.id: required; letters, digits, '_', '.', '-' (no '--'), at most 64 characters"
        )
    for key in s:
        if key not in _SERVER_KEYS:
            problems.append(unknown_key(where, key, _SERVER_KEYS, "see the README for server keys"))
    command = s.get("command")
    url = s.get("url")
    if command is None and url is None:
        problems.append(
            f"{where}: set command (a list: a stdio server) or url (ws:// or wss://), or both "
            "(a websocket server the host starts)"
        )
    if command is not None and (
        not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command)
    ):
        problems.append(f"{where}.command: must be a non-empty list of strings (argv)")
        command = None
    endpoint = None
    if url is not None:
        try:
            endpoint = parse_endpoint(url).resolved_transport
        except McplUriError as exc:
            problems.append(
                f"{where}.url: must be an mcpl://, wss:// or ws:// address ({exc.reason})"
            )
            url = None
    env = s.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
        problems.append(f"{where}.env: must be a table of strings")
        env = {}
    token = s.get("token")
    token_env = s.get("token_env")
    if token is not None and not isinstance(token, str):
        problems.append(f"{where}.token: must be a string")
        token = None
    if token_env is not None:
        if not isinstance(token_env, str):
            problems.append(f"{where}.token_env: must be the name of an environment variable")
        elif token is None:
            token = os.environ.get(token_env)
            if token is None:
                problems.append(f"{where}.token_env: environment variable {token_env} is not set")
    caps = {
        k: _str_list(f"{where}.{k}", s.get(k), problems)
        for k in (
            "enabled_capabilities",
            "disabled_capabilities",
            "enabled_feature_sets",
            "disabled_feature_sets",
        )
    }
    numbers = {
        key: _number(
            f"{where}.{key}", s.get(key), default, problems, integer=isinstance(default, int)
        )
        for key, default in (
            ("request_timeout_s", REQUEST_TIMEOUT_S),
            ("max_line_bytes", 4_194_304),
            ("eager_limit_bytes", 262_144),
            ("fetch_ceiling_bytes", 268_435_456),
            ("fetch_budget_bytes", 1_073_741_824),
            ("hook_timeout_s", 5.0),
            ("inference_requests_per_hour", 60),
        )
    }
    routes = s.get("inference_models", {})
    inference_models: dict[str, str] = {}
    if not isinstance(routes, Mapping):
        problems.append(f"{where}.inference_models: must be a table of feature set = model")
    else:
        for pattern, spec in routes.items():
            checked = _model_spec(f"{where}.inference_models.{pattern}", spec, base, problems)
            if checked is not None:
                inference_models[pattern] = checked
    publish_undeclared = s.get("publish_undeclared", False)
    if not isinstance(publish_undeclared, bool):
        problems.append(f"{where}.publish_undeclared: must be true or false")
        publish_undeclared = False
    unlisted = _str_list(f"{where}.allow_unlisted_uses", s.get("allow_unlisted_uses"), problems)
    for cap in unlisted or ():
        if cap not in TAGGED_CAPABILITIES:
            problems.append(
                f"{where}.allow_unlisted_uses: {cap!r} is not a capability a feature set "
                f"names; one of {', '.join(sorted(TAGGED_CAPABILITIES))}"
            )
    if not valid:
        return None
    assert isinstance(sid, str)
    return ServerConfig(
        id=sid,
        command=tuple(command) if command else None,
        url=url,
        endpoint=endpoint,
        env=dict(env),
        token=token,
        request_timeout_s=float(numbers["request_timeout_s"]),
        max_line_bytes=numbers["max_line_bytes"],
        enabled_capabilities=caps["enabled_capabilities"],
        disabled_capabilities=caps["disabled_capabilities"] or (),
        enabled_feature_sets=caps["enabled_feature_sets"],
        disabled_feature_sets=caps["disabled_feature_sets"] or (),
        eager_limit_bytes=numbers["eager_limit_bytes"],
        fetch_ceiling_bytes=numbers["fetch_ceiling_bytes"],
        fetch_budget_bytes=numbers["fetch_budget_bytes"],
        hook_timeout_s=float(numbers["hook_timeout_s"]),
        inference_requests_per_hour=numbers["inference_requests_per_hour"],
        inference_models=inference_models,
        publish_undeclared=publish_undeclared,
        allow_unlisted_uses=tuple(c for c in unlisted or () if c in TAGGED_CAPABILITIES),
        cwd=base,
    )


_AGENT_KEYS = {f.name for f in attrs.fields(AgentConfig)}


def load_gate(path: Path) -> GateConfig:
    """An agent's gate policy file (JSON when it ends in ``.json``, else TOML); any problem is
    a ``ConfigError`` of one line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the gate file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    fmt = "json" if path.suffix.lower() == ".json" else "toml"
    try:
        return parse_gate(text, fmt)
    except GateConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def with_gate_policies(cfg: HostConfig) -> HostConfig:
    """``cfg`` with every agent's gate file read now (a ``ConfigError`` names a broken one): a
    reload puts in force what the files say at that moment, whatever read them before."""
    agents = tuple(
        a if a.gate is None else attrs.evolve(a, gate_policy=load_gate(a.gate)) for a in cfg.agents
    )
    return attrs.evolve(cfg, agents=agents)


def _agent(i: int, a: Mapping[str, Any], base: Path, problems: list[str]) -> AgentConfig | None:
    name = a.get("name")
    where = _where("agents", name, i)
    valid = isinstance(name, str) and bool(_AGENT_NAME.fullmatch(name))
    if not valid:
        problems.append(f"{where}.name: required; letters, digits, '_', '.', '-' (at most 64)")
    for key in a:
        if key not in _AGENT_KEYS:
            problems.append(unknown_key(where, key, _AGENT_KEYS, "see the README for agent keys"))
    model = a.get("model")
    if model is None:
        problems.append(f"{where}.model: required; {MODEL_SPECS}")
        valid = False
    endpoint = _endpoint(where, a, model, problems)
    if model is not None:
        model = _model_spec(
            f"{where}.model",
            model,
            base,
            problems,
            base_url=endpoint.get("base_url"),
            api_key_env=endpoint.get("api_key_env"),
            check_key=all(endpoint.get(k) == a.get(k) for k in ("base_url", "api_key_env")),
        )
        valid = valid and model is not None
    sampling = _sampling(where, a, model, problems)
    prompt = a.get("system_prompt")
    if prompt is not None and not isinstance(prompt, str):
        problems.append(f"{where}.system_prompt: must be a string")
        prompt = None
    mode = a.get("prose_mode", "locus")
    if mode not in PROSE_MODES:
        problems.append(f"{where}.prose_mode: must be one of {', '.join(PROSE_MODES)}")
        mode = "locus"
    gate = a.get("gate")
    gate_path = None
    gate_policy = None
    gate_preset = None
    if gate is not None:
        if not isinstance(gate, str):
            problems.append(f"{where}.gate: must be a path string or a preset name")
        elif gate in PRESETS:
            gate_preset = gate
            gate_policy = preset(gate)
        else:
            gate_path = (base / gate).resolve()
            try:
                gate_policy = load_gate(gate_path)
            except ConfigError as exc:
                problems.append(f"{where}.gate: {exc}")
    aliases = _aliases(where, a.get("aliases"), problems)
    summary_model = _summary_model(where, a.get("summary_model"), model, endpoint, base, problems)
    images = a.get("images", True)
    if not isinstance(images, bool):
        problems.append(f"{where}.images: must be true or false")
        images = True
    servers = _str_list(f"{where}.servers", a.get("servers"), problems)
    context_tokens = _number(
        f"{where}.context_tokens", a.get("context_tokens"), 60_000, problems, integer=True
    )
    budget = _number(
        f"{where}.budget_daily_tokens", a.get("budget_daily_tokens"), None, problems, integer=True
    )
    budget_usd = _number(f"{where}.budget_daily_usd", a.get("budget_daily_usd"), None, problems)
    if not valid:
        return None
    assert isinstance(name, str) and isinstance(model, str)
    return AgentConfig(
        name=name,
        model=model,
        system_prompt=prompt,
        servers=servers,
        prose_mode=mode,
        gate=gate_path,
        gate_policy=gate_policy,
        gate_preset=gate_preset,
        aliases=aliases,
        context_tokens=context_tokens,
        summary_model=summary_model,
        images=images,
        budget_daily_tokens=budget,
        budget_daily_usd=budget_usd,
        **endpoint,
        **sampling,
    )


def _aliases(where: str, value: Any, problems: list[str]) -> tuple[str, ...]:
    """The agent's checked ``aliases``: at most ``MAX_ALIASES`` non-blank strings."""
    if value is None:
        return ()
    if (
        not isinstance(value, list)
        or len(value) > MAX_ALIASES
        or not all(isinstance(v, str) and v.strip() and len(v) <= MAX_ALIAS for v in value)
    ):
        problems.append(
            f"{where}.aliases: must be a list of at most {MAX_ALIASES} names "
            f"(each 1 to {MAX_ALIAS} characters)"
        )
        return ()
    return tuple(v.strip() for v in value)


def _summary_model(
    where: str,
    value: Any,
    model: Any,
    endpoint: Mapping[str, Any],
    base: Path,
    problems: list[str],
) -> str | None:
    """The agent's checked ``summary_model`` spec: with the agent's endpoint and key when it
    names the same provider as ``model``, else that provider's defaults."""
    if value is None:
        return None
    same = (
        isinstance(value, str)
        and isinstance(model, str)
        and value.partition(":")[0] == model.partition(":")[0]
    )
    return _model_spec(
        f"{where}.summary_model",
        value,
        base,
        problems,
        base_url=endpoint.get("base_url") if same else None,
        api_key_env=endpoint.get("api_key_env") if same else None,
    )


def _endpoint(where: str, a: Mapping[str, Any], model: Any, problems: list[str]) -> dict[str, Any]:
    """The agent's checked ``base_url`` and ``api_key_env`` (those it sets)."""
    found: dict[str, Any] = {}
    provider = model.partition(":")[0] if isinstance(model, str) else None
    base_url = a.get("base_url")
    if base_url is not None:
        parts = urlsplit(base_url) if isinstance(base_url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(f"{where}.base_url: must be an http:// or https:// address")
        elif parts.hostname in PUBLIC_ENDPOINTS and a.get("api_key_env") is None:
            owner = PUBLIC_ENDPOINTS[parts.hostname]
            problems.append(
                f"{where}.base_url: {base_url} is {owner}'s public endpoint, and with a base_url "
                f"and no api_key_env no key is sent; remove base_url (that endpoint is the "
                f"default, with the key in {PROVIDER_KEYS[owner]}) or set api_key_env"
            )
        else:
            found["base_url"] = base_url
    api_key_env = a.get("api_key_env")
    if api_key_env is not None:
        if not isinstance(api_key_env, str) or not _ENV_NAME.fullmatch(api_key_env):
            problems.append(f"{where}.api_key_env: must be the name of an environment variable")
        else:
            found["api_key_env"] = api_key_env
    if provider == "scripted":
        for key in ("base_url", "api_key_env"):
            if a.get(key) is not None:
                problems.append(f"{where}.{key}: a scripted model calls no provider; remove it")
                found.pop(key, None)
    return found


def _sampling(where: str, a: Mapping[str, Any], model: Any, problems: list[str]) -> dict[str, Any]:
    """The agent's checked ``max_tokens`` and ``temperature`` (those it sets)."""
    found: dict[str, Any] = {}
    max_tokens = a.get("max_tokens")
    if max_tokens is not None:
        whole = isinstance(max_tokens, int) and not isinstance(max_tokens, bool)
        if not whole or not 1 <= max_tokens <= MAX_TOKENS_CAP:
            problems.append(
                f"{where}.max_tokens: must be a whole number from 1 to {MAX_TOKENS_CAP:,}"
            )
        else:
            found["max_tokens"] = max_tokens
    temperature = a.get("temperature")
    if temperature is not None:
        provider = model.partition(":")[0] if isinstance(model, str) else "openai"
        top = MAX_TEMPERATURE.get(provider, 2.0)
        number = isinstance(temperature, int | float) and not isinstance(temperature, bool)
        if not number or not math.isfinite(temperature) or not 0 <= temperature <= top:
            problems.append(
                f"{where}.temperature: must be a number from 0 to {top:g}"
                + (f" for {provider}: models" if top != 2.0 else "")
            )
        else:
            found["temperature"] = float(temperature)
    return found
