"""One rank of test_stack_accelerate.py's job, under torchrun: Hugging Face Accelerate with a
datahelix.DataLoader, its state carried by accelerator.save_state / load_state.

    torchrun --nproc_per_node W stack_accelerate_rank.py PROFILES OUT RUN CKPT BATCH KEEP
        SAVE_AT HANG_AT [--resume]

Records each batch's sample ids (OUT/RUN.rankR.jsonl, stack_job.py). Without --resume:
save_state(CKPT) after SAVE_AT steps (then CKPT/READY), and after HANG_AT steps block until
killed. With --resume: load_state(CKPT) (KEEP is the loader's elastic_keep) and run the epoch
to its end."""
import gc
import json
import os
import sys
import threading

import torch
import torch.nn.functional as F
from accelerate import Accelerator

import datahelix

SEED = 11
SYNTH = {"type": "synthetic", "cost": "none", "bytes_scale": 0.0001}


def main():
    profiles, out, run, ckpt, batch, keep, save_at, hang_at = sys.argv[1:9]
    batch, save_at, hang_at = int(batch), int(save_at), int(hang_at)
    resume = "--resume" in sys.argv[9:]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    loader = datahelix.DataLoader(profiles, pipeline=SYNTH, batch_size=batch, seed=SEED,
                                  prefetch=2, workers=1, timeout=60, log_level="warn",
                                  elastic_keep=None if keep == "none" else keep)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt, prepared = accelerator.prepare(model, opt, loader)
    # prepare() hands the loader back as it is: DataHelix already gives each rank its own
    # batches, so nothing re-shards or dispatches them
    assert prepared is loader, type(prepared)
    accelerator.register_for_checkpointing(loader)
    steps = len(loader)  # as scripts do for their schedule, before load_state
    if resume:
        accelerator.load_state(ckpt)
        # the resumed pass: its count goes on from the saved step, len() is that plus the
        # batches left (more than a fresh epoch's on a larger global batch)
        steps = len(loader)
    first = loader.state_dict()["step"]
    rank = accelerator.process_index
    assert loader.rank == rank and loader.world_size == accelerator.num_processes
    with open(os.path.join(out, f"{run}.rank{rank}.jsonl"), "a") as rec:
        for step, b in enumerate(loader, start=first):
            assert b["tokens"].device.type == "cpu"  # the loader's own tensors, not moved
            x = b["tokens"].float().div(1e4).unsqueeze(1).to(accelerator.device)
            loss = F.mse_loss(model(x), torch.zeros_like(x))
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            rec.write(json.dumps({"step": step, "ids": list(b["sample_ids"])}) + "\n")
            rec.flush()
            if not resume and step + 1 == save_at:
                accelerator.save_state(ckpt)
                accelerator.wait_for_everyone()
                if accelerator.is_main_process:
                    with open(os.path.join(ckpt, "READY.tmp"), "w") as f:
                        f.write(str(step + 1))
                    os.replace(os.path.join(ckpt, "READY.tmp"), os.path.join(ckpt, "READY"))
            if not resume and step + 1 == hang_at:
                threading.Event().wait()  # until the test kills the job
    assert step + 1 == steps, (step, steps)
    loader.close()
    accelerator.wait_for_everyone()  # done with the node's DataServer before rank 0 leaves
    del model, opt
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
