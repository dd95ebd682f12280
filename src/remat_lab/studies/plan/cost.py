"""A plan's cost at a price per chip-hour: dollars per million tokens, the days and dollars of a budget."""

from __future__ import annotations

from remat_lab.config import ConfigError, get_target


def price_of(target: str, typed: float | None) -> tuple[float | None, str]:
    """``(dollars per device-hour, where it comes from)``: the typed price, else the target's
    sourced default (``targets.json``'s ``price``), else none."""
    if typed is not None:
        if not typed > 0:
            raise ConfigError("a price per chip-hour must be a positive number of dollars.")
        return float(typed), "typed"
    t = get_target(target)
    per = t.usd_per_device_hour()
    if per is None:
        return None, f"no sourced default price for {target}: type one"
    return per, f"default, as of {t.price.get('as_of')}: {t.price['source']}"


def cost(tokens_per_s_per_device: float | None, devices: int, usd_per_device_hour: float | None,
         budget_tokens: float | None) -> dict:
    """One plan's ``usd_per_million_tokens`` and, for ``budget_tokens``, the ``days`` on all
    ``devices`` and the ``usd`` it costs; None where the rate or the price is missing."""
    out = {"usd_per_million_tokens": None, "budget_tokens": budget_tokens, "days": None, "usd": None}
    if not tokens_per_s_per_device or not usd_per_device_hour:
        return out
    out["usd_per_million_tokens"] = usd_per_device_hour / 3600 / tokens_per_s_per_device * 1e6
    if budget_tokens:
        out["days"] = budget_tokens / (tokens_per_s_per_device * devices) / 86400
        out["usd"] = out["usd_per_million_tokens"] * budget_tokens / 1e6
    return out


def add_costs(doc: dict, typed: float | None, budget_tokens: float | None) -> None:
    """Each plan's and published row's ``cost`` and ``cost_per_million_tokens`` at the price (typed,
    else the target's default); ``doc["cost"]`` says which price and budget."""
    price, source = price_of(doc["target"], typed)
    for row in doc["plans"] + [r for r in doc["published_rows"] if "error" not in r]:
        row["cost"] = cost(row.get("predicted_tokens_per_s_per_device"), doc["devices"], price, budget_tokens)
        row["cost_per_million_tokens"] = row["cost"]["usd_per_million_tokens"]
    doc["cost"] = {"usd_per_device_hour": price, "price_source": source, "budget_tokens": budget_tokens}


def across_row(target: str, devices: int, doc: dict) -> dict:
    """One accelerator's best plan, for the side-by-side table (``doc`` with its costs)."""
    best = doc["plans"][0] if doc["plans"] else None
    tps = best and best["predicted_tokens_per_s_per_device"]
    keys = ("mesh", "plan_text", "per_device_batch", "microbatches", "optimizer_offload", "peak_bytes",
            "predicted_s", "predicted_mfu", "cost_per_million_tokens", "cost")
    return {"target": target, "devices": devices, "price_per_device_hour": doc["cost"]["usd_per_device_hour"],
            "price_source": doc["cost"]["price_source"],
            "best": best and {k: best.get(k) for k in keys},
            "predicted_tokens_per_s_per_device": tps,
            "predicted_tokens_per_s": tps * devices if tps else None, "wall_s": doc["wall_s"],
            "stopped": doc.get("stopped")}
