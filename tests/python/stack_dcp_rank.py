"""One rank of test_stack_dcp.py's job, under torchrun: a DDP model (gloo, CPU) and a
datahelix.DataLoader in one torch.distributed.checkpoint state, {"app": model and optimizer,
"loader": loader}: the loader under one key on every rank (DCP keeps one value per key, and
any rank's state resumes every rank, of any world size).

    torchrun --nproc_per_node W stack_dcp_rank.py PROFILES OUT RUN CKPT BATCH KEEP SAVE_AT
        HANG_AT [--resume]

Records each batch's sample ids (OUT/RUN.rankR.jsonl, stack_job.py). Without --resume:
dcp.save to CKPT after SAVE_AT steps (each rank's loader state also to
OUT/saved.rankR.json), and after HANG_AT steps block until killed. With --resume: dcp.load
from CKPT (KEEP is the loader's elastic_keep; the state DCP handed the loader goes to
OUT/handed.rankR.json) and run the epoch to its end."""
import gc
import json
import os
import sys
import threading

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

import datahelix

SEED = 11
SYNTH = {"type": "synthetic", "cost": "none", "bytes_scale": 0.0001}


class App(Stateful):
    """The model and optimizer, as torch's DCP recipe has them."""

    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def state_dict(self):
        model, optim = get_state_dict(self.model, self.opt)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state):
        set_state_dict(self.model, self.opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])


def main():
    profiles, out, run, ckpt, batch, keep, save_at, hang_at = sys.argv[1:9]
    batch, save_at, hang_at = int(batch), int(save_at), int(hang_at)
    resume = "--resume" in sys.argv[9:]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = datahelix.DataLoader(profiles, pipeline=SYNTH, batch_size=batch, seed=SEED,
                                  prefetch=2, workers=1, timeout=60, log_level="warn",
                                  elastic_keep=None if keep == "none" else keep)
    assert isinstance(loader, Stateful)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    state = {"app": App(model, opt), "loader": loader}
    if resume:
        handed = []
        load = loader.load_state_dict
        loader.load_state_dict = lambda s, **kw: (handed.append(dict(s)), load(s, **kw))[1]
        dcp.load(state, checkpoint_id=ckpt)
        del loader.load_state_dict
        with open(os.path.join(out, f"handed.rank{rank}.json"), "w") as f:
            json.dump(handed, f)
    first = loader.state_dict()["step"]
    with open(os.path.join(out, f"{run}.rank{rank}.jsonl"), "a") as rec:
        for step, b in enumerate(loader, start=first):
            x = b["tokens"].float().div(1e4).unsqueeze(1)
            loss = F.mse_loss(model(x), torch.zeros_like(x))
            loss.backward()
            opt.step()
            opt.zero_grad()
            rec.write(json.dumps({"step": step, "ids": list(b["sample_ids"])}) + "\n")
            rec.flush()
            if not resume and step + 1 == save_at:
                with open(os.path.join(out, f"saved.rank{rank}.json"), "w") as f:
                    json.dump(loader.state_dict(), f)
                dcp.save(state, checkpoint_id=ckpt)  # CKPT/.metadata comes last
            if not resume and step + 1 == hang_at:
                threading.Event().wait()  # until the test kills the job
    assert step + 1 == len(loader), (step, len(loader))
    loader.close()
    dist.barrier()  # every rank is done with the node's DataServer before rank 0 leaves
    del model, opt, state
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
