"""The doctor's network checks: MASTER_ADDR (resolves, routes, is where rank 0 runs, not loopback
across nodes), MASTER_PORT (job-unique), and NCCL/GLOO_SOCKET_IFNAME (exists here, is what the
runtime's netif would pick). Pure functions of the recorded `Facts`."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from torchslurm.doctor.facts import (
    Check,
    Facts,
    Status,
    first_node,
    from_error,
    master_name,
    num_nodes,
    placement,
    requested_backend,
    skipped,
    slurm_nodes,
)
from torchslurm.errors import EnvError
from torchslurm.runtime import distenv, netif, ports
from torchslurm.runtime.netif import IfAddr


def check_master_addr(facts: Facts) -> Check:
    env = placement(facts.environ)
    if env is None:
        return skipped("master_addr")
    master = master_name(env, facts.environ)
    nodes = num_nodes(env, facts.environ)
    hard_coded = bool(facts.environ.get("MASTER_ADDR"))
    given = f"MASTER_ADDR={master}" if hard_coded else f"MASTER_ADDR (unset; torchslurm uses {master})"
    if facts.resolve_error:
        return from_error("master_addr", facts.resolve_error, value=master)
    if not facts.master_ips:
        return Check("master_addr", "error", f"{given} resolves to no address here.",
                     "use a node name of this job or an IP address.", master)
    shown = f"{given} resolves to {', '.join(facts.master_ips)} on {facts.hostname}"
    first = first_node(env, facts.environ)
    # A MASTER_ADDR naming a node of the job is fine: the first task there hosts the store (distenv).
    if (first and master != first and master not in slurm_nodes(env, facts.environ) and facts.first_node_ips
            and hard_coded and not set(facts.master_ips) & set(facts.first_node_ips)):
        return Check("master_addr", "error", f"{shown}, but rank 0 runs on {first} ({facts.first_node_ips[0]}), the "
                     "first node of this Slurm step: rank 0 starts the store there while the others wait at "
                     f"{master} (a hard-coded MASTER_ADDR that is none of the job's nodes).", "remove MASTER_ADDR "
                     "from the job script; torchslurm "
                     "uses the first node of the step (or: scontrol show hostnames $SLURM_JOB_NODELIST | head -n1).",
                     master)
    loopback = all(ipaddress.ip_address(ip.split("%", 1)[0]).is_loopback for ip in facts.master_ips)
    if loopback and nodes > 1:
        if netif._is_local_name(master) or not _on_master_node(env):
            return Check("master_addr", "error", f"{shown}, a loopback address, but the job spans {nodes} nodes and "
                         "rank 0 is not on this one: this node's ranks would connect to themselves.",
                         "set MASTER_ADDR to the first node of the job (scontrol show hostnames "
                         "$SLURM_JOB_NODELIST | head -n1), or leave it unset under srun.", master)
        return Check("master_addr", "warning", f"{shown}, a loopback address (a Debian-style '127.0.1.1 <hostname>' "
                     "line in /etc/hosts): plain Gloo binds loopback and the other nodes get 'Connection refused'. "
                     "torchslurm.init() avoids it by setting GLOO_SOCKET_IFNAME to this node's real interface.",
                     "give the node's name its real address in /etc/hosts, or use torchslurm.init() "
                     "(or set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME per node).", master)
    if facts.source is None:
        return Check("master_addr", "error", f"{shown}, but this host has no route to it.",
                     "check that MASTER_ADDR names a node of this job.", master)
    return Check("master_addr", "ok", f"{shown}; reached from {facts.source}.", value=master)


def check_master_port(facts: Facts) -> Check:
    env = placement(facts.environ)
    if env is None:
        return skipped("master_port")
    port = facts.environ.get("MASTER_PORT")
    if port is None:
        if env.job_id is None:
            return Check("master_port", "ok", "MASTER_PORT unset: torchslurm picks a free port at start-up.")
        source = f"job {env.job_id}'s secret" if ports.JOB_SECRET in facts.environ else f"job {env.job_id}"
        return Check("master_port", "ok", f"MASTER_PORT unset: torchslurm uses {env.master_port}, derived from "
                     f"{source}.", value=str(env.master_port))
    if "TORCHELASTIC_RUN_ID" in facts.environ:
        return Check("master_port", "ok", f"MASTER_PORT={port}, chosen by torchrun.", value=port)
    derived = ports.derived_port(facts.environ.get("SLURM_JOB_ID", "0"), facts.environ.get("SLURM_STEP_ID"))
    if env.job_id is not None and port.strip() == str(derived):
        return Check("master_port", "ok", f"MASTER_PORT={port}, derived from job {env.job_id} by torchslurm.",
                     value=port)
    if env.job_id is not None:
        return Check("master_port", "warning", f"MASTER_PORT={port} is fixed inside Slurm job {env.job_id}: when two "
                     "jobs share a node, the second job's rank 0 gets 'address in use' and its other ranks join "
                     "the first job's store, breaking both.",
                     f"unset MASTER_PORT; torchslurm derives a job-unique port ({derived} for this step).", port)
    return Check("master_port", "ok", f"MASTER_PORT={port} (fixed; two runs on this machine at once would collide).",
                 value=port)


def check_interfaces(facts: Facts, backend: str | None = None) -> list[Check]:
    """One check per *_SOCKET_IFNAME variable: the user's value exists here, or what torchslurm picks."""
    env = placement(facts.environ)
    if env is None:
        return [skipped(name.lower()) for name in netif.ENV_NAMES]
    chosen, why, fix = _chosen_interface(facts, env)
    requested = requested_backend(facts, backend)[0]
    uses_nccl = (requested or ("nccl" if facts.torch and facts.torch.cuda_device_count else "gloo")) == "nccl"
    checks = []
    for var in netif.ENV_NAMES:
        name, value = var.lower(), facts.environ.get(var)
        if not value:
            if chosen is None:
                checks.append(Check(name, "error", f"{var} unset and torchslurm cannot choose an interface: {why}",
                                    fix or f"set {var} to the interface of the cluster network on this node "
                                    f"({_names(facts.interfaces)})."))
            else:
                checks.append(Check(name, "ok", f"{var} unset: torchslurm sets it to {chosen} ({why}).", value=chosen))
            continue
        important = var.startswith("GLOO") or uses_nccl
        checks.append(_user_interface(var, value, facts, env, chosen, important))
    return checks


def _chosen_interface(facts: Facts, env: distenv.DistEnv) -> tuple[str | None, str, str | None]:
    """(the interface torchslurm would pick or None, why, the fix when there is none and netif knows it)."""
    master = master_name(env, facts.environ)
    if facts.resolve_error or not facts.master_ips:
        return None, f"MASTER_ADDR={master!r} does not resolve here (see master_addr)", None
    if facts.source is None:
        return None, f"no route to MASTER_ADDR={master!r} ({facts.master_ips[0]})", None
    try:
        name, why = netif.choose_interface(master, facts.master_ips, facts.source, facts.interfaces,
                                           facts.own_addresses)
    except EnvError as exc:
        return None, exc.message, exc.hint
    return name, why, None


def _user_interface(var: str, value: str, facts: Facts, env: distenv.DistEnv, chosen: str | None,
                    important: bool) -> Check:
    """A user-set NCCL/GLOO_SOCKET_IFNAME: every name must exist (and be UP with an address) here."""
    names = sorted({entry.name for entry in facts.interfaces})
    if var.startswith("NCCL") and value.startswith("^"):
        return Check(var.lower(), "ok", f"{_setting(var, value)} excludes interfaces; NCCL picks among the rest "
                     f"({', '.join(names)}).", value=value)
    exact = var.startswith("GLOO") or value.startswith("=")
    wanted = [part.strip() for part in value.lstrip("=").split(",") if part.strip()]
    matched = [n for n in names if any(n == w if exact else n.startswith(w) for w in wanted)]
    missing = [w for w in wanted if not any(n == w if exact else n.startswith(w) for n in names)]
    nodes = num_nodes(env, facts.environ)
    fix = (f"unset {var} (torchslurm picks each node's own interface{': ' + chosen + ' here' if chosen else ''}), "
           f"or set it per node")
    if missing:
        status: Status = "error" if important else "warning"
        return Check(var.lower(), status, f"{_setting(var, value)} but this node ({facts.hostname}) has no UP "
                     f"interface {' or '.join(missing)}; it has: {', '.join(names) or 'none'}. Nodes often name "
                     "their NICs differently (eth0, ens1f0, ...), so one value for every node breaks on some of them"
                     + (" (Gloo: 'Unable to find address for ...')." if var.startswith("GLOO") else "."),
                     fix + ".", value)
    loopback = {entry.name for entry in facts.interfaces if entry.loopback}
    if nodes > 1 and set(matched) <= loopback:
        return Check(var.lower(), "error" if important else "warning", f"{_setting(var, value)} is the loopback "
                     f"interface but the job spans {nodes} nodes: peers on other nodes cannot connect to it.",
                     fix + ".", value)
    if chosen is not None and chosen not in matched:
        return Check(var.lower(), "warning", f"{_setting(var, value)} exists here, but the kernel reaches the master "
                     f"through {chosen}.", f"set {var}={chosen} on this node, or unset it.", value)
    route = " and reaches the master" if chosen in matched else ""
    return Check(var.lower(), "ok", f"{_setting(var, value)} is set; {', '.join(matched)} is UP on "
                 f"{facts.hostname}{route}.", value=value)


def _setting(var: str, value: str) -> str:
    """NCCL's exact-match form '=eth0' shown readably: NCCL_SOCKET_IFNAME='=eth0' (exactly eth0)."""
    return f"{var}='{value}' (exactly {value[1:]})" if value.startswith("=") else f"{var}={value}"


def _on_master_node(env: distenv.DistEnv) -> bool:
    """Rank 0 runs on node 0 (srun, torchrun), and a batch shell runs on the job's first node."""
    return env.launcher == "batch" or env.node_rank == 0


def _names(table: Sequence[IfAddr]) -> str:
    return ", ".join(sorted({entry.name for entry in table})) or "none"
