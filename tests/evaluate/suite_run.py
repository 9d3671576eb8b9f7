"""``run_named_suite``: one evaluation suite run in process with its own settings, as the CLI's
``--suite NAME --set NAME.KEY=VALUE --limit N`` would run it (shared by the suites' tests)."""

from rpc_attention.evaluate.suites import get_suite, resolve_options, run_suite


def run_named_suite(name, model, cfg, limit, **sets):
    """The record of suite ``name`` on ``model`` (``cfg``: its run config) on the first ``limit`` test
    examples, with the settings ``sets`` (``KEY=VALUE``, given as ``name.KEY``)."""
    suite = get_suite(name)
    opts = resolve_options(suite, {f"{name}.{k}": v for k, v in sets.items()}, limit=limit)
    return run_suite(suite, model, cfg, None, opts)
