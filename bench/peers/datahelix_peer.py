"""datahelix: the `datahelix` Python extension's DataLoader, fed by one local cluster.

The launcher starts datahelix.start_cluster(DIR, workers=W, listen="tcp://127.0.0.1:PORT")
(a coordinator and a local DataServer of W decode workers: the same CPU budget as the
peers); each rank opens datahelix.DataLoader(DIR, batch_size=B, shuffle=True, seed=S,
coordinator=ENDPOINT, rank=r, world_size=R[, prefetch=P]) and iterates it. A batch is a dict
{"frames": B x T x 3 x H x W uint8, "mask": B x T, "tokens": int64 B, "sample_ids",
"captions", "info"}; its size may vary (the token packing plan), so the step's compute uses
the batch's own "tokens" and sample count. batch_ready_p95_s comes from info's
requested_ns -> ready_ns (the C harness's request sent -> batch ready), when there.

The loader runs with epochs=0 (no end) and a huge max_steps, so one pass runs epoch after
epoch with prefetch crossing the boundaries, as the peers' samplers do.

`datahelix` is imported from the environment, else from build/python (what `make build`
makes); if that fails too, the system is skipped and the report says why.
"""
import os
import sys

NAME = "datahelix"
_BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "build", "python")


def unavailable():
    try:
        import datahelix
    except ImportError as first:
        if not os.path.exists(os.path.join(_BUILD, "datahelix", "__init__.py")):
            return (f"cannot import datahelix: {first} (build the Python extension with "
                    f"`make build`, or put it on PYTHONPATH)")
        sys.path.insert(0, _BUILD)  # the ranks inherit sys.path (spawn)
        try:
            import datahelix
        except ImportError as e:
            return f"cannot import datahelix from {_BUILD}: {e}"
    missing = [n for n in ("DataLoader", "start_cluster") if not hasattr(datahelix, n)]
    if missing:
        return f"the datahelix module has no {', '.join(missing)}"
    return None


def cores(cfg):
    return cfg["workers"]


_CLUSTER = []


def setup(cfg):
    import datahelix

    import common

    cluster = datahelix.start_cluster(cfg["dataset"], workers=cfg["workers"],
                                      listen=f"tcp://127.0.0.1:{common.free_port()}")
    _CLUSTER.append(cluster)
    return {"endpoint": cluster.endpoint}


def teardown(context):
    while _CLUSTER:
        _CLUSTER.pop().close()


class _Epochs:
    """The loader, pass after pass (each pass is many epochs back to back: epochs=0 with
    max_steps, so prefetch runs on across epoch boundaries as the peers' samplers do)."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        epoch = 0
        while True:
            self.loader.set_epoch(epoch)
            got = False
            for batch in self.loader:
                got = True
                yield batch
            if not got:
                raise RuntimeError(f"datahelix.DataLoader: epoch {epoch} yielded no batch")
            epoch += 1

    def close(self):
        self.loader.close()


def open_loader(cfg, context, rank):
    import datahelix

    extra = {"prefetch": cfg["prefetch"]} if cfg["prefetch"] else {}
    if cfg.get("prefetch_max"):
        extra["prefetch_max"] = cfg["prefetch_max"]
    if cfg.get("plan"):
        extra["plan"] = cfg["plan"]
    return _Epochs(datahelix.DataLoader(cfg["dataset"], batch_size=cfg["batch"], shuffle=True,
                                        seed=cfg["seed"], coordinator=context["endpoint"],
                                        rank=rank, world_size=cfg["ranks"], epochs=0,
                                        max_steps=1 << 40, **extra))


def _total(tokens):
    if hasattr(tokens, "sum"):
        return int(tokens.sum())
    return int(sum(tokens))


def batch_info(cfg, batch):
    ids = list(batch["sample_ids"])
    info = batch.get("info") or {}
    req, ready = info.get("requested_ns") or 0, info.get("ready_ns") or 0
    ready_s = (ready - req) / 1e9 if req and ready > req else None
    return len(ids), _total(batch["tokens"]), ids, ready_s


def consume(batch):
    pass  # zero-copy delivery


def close_loader(loader):
    close = getattr(loader, "close", None)
    if close:
        close()
