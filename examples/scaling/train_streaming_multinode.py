"""Distributed, resumable streaming training with Accelerate (one process per GPU, any number of nodes).

    .venv/bin/python -m accelerate.commands.launch --num_processes 8 examples/scaling/train_streaming_multinode.py --dataset /data/robocasa
    ACCELERATE_USE_CPU=true .venv/bin/python -m accelerate.commands.launch --multi_gpu --num_processes 2 examples/scaling/train_streaming_multinode.py --dummy

``.venv/bin/python -m accelerate.commands.launch`` is ``accelerate launch`` run by the checkout's venv
(a bare ``accelerate`` is found only with the venv activated). The second command runs 2 processes on
CPU (no GPU needed): Accelerate's ``--cpu`` flag starts one process whatever ``--num_processes`` says (its route to several CPU processes is mpirun), so it
takes the multi-process launcher, and ``ACCELERATE_USE_CPU=true`` puts each process on the CPU,
joined by gloo. Each run prints the world size it saw.

No DistributedSampler and no ``accelerator.prepare(dataloader)``: every rank builds its own
``EpisodeStreamingDataset``, which reads its rank and world size from torch.distributed (set up by
Accelerate) and streams a disjoint, equal-sized share of each epoch. By default batches come from
``EpisodeLoader`` (decode threads in the trainer's process; ``--loader dataloader`` uses DataLoader
worker processes instead). The loader's state is saved next to Accelerate's checkpoint
(``stream_state.json``) and restored on restart, so a preempted job continues with exactly the
samples it would have seen. ``--dummy`` only loads data and logs throughput (samples/s and frames/s
per node).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.utils.data
from accelerate import Accelerator

from episodestream import EpisodeLoader, EpisodeStreamingDataset, stream_state
from episodestream.tools.synthetic import write_synthetic_dataset


class TinyPolicy(nn.Module):
    """State + one camera -> action: just enough model to exercise the training loop."""

    def __init__(self, state_dim: int, action_dim: int) -> None:
        super().__init__()
        self.vision = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(8 + state_dim, 64), nn.ReLU(), nn.Linear(64, action_dim))

    def forward(self, image: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.vision(image), state], dim=-1))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", help="LeRobot v3.0 dataset (default: a synthetic one written by rank 0)")
    parser.add_argument("--output-dir", default="outputs/train_streaming_multinode")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--loader", choices=("episode", "dataloader"), default="episode",
                        help="episode: EpisodeLoader (decode threads in this process); dataloader: torch "
                             "DataLoader with --num-workers worker processes")
    parser.add_argument("--num-threads", type=int, default=None, help="EpisodeLoader decode threads "
                        "(default: the cores this process may use)")
    parser.add_argument("--num-workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--pool-size", type=lambda v: v if v == "auto" else int(v), default="auto",
                        help="episodes each consumer holds: an int, or 'auto' (the library's default)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (all epochs)")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    parser.add_argument("--dummy", action="store_true", help="only load data and log throughput")
    parser.add_argument("--record-indices", action="store_true",
                        help="write each rank's sample indices to OUTPUT_DIR/indices-rank<R>.json (for tests)")
    return parser.parse_args(argv)


def ensure_dataset(args, accelerator: Accelerator) -> Path:
    if args.dataset:
        return Path(args.dataset)
    root = Path(args.output_dir) / "synthetic"
    if accelerator.is_main_process and not (root / "meta" / "info.json").exists():
        write_synthetic_dataset(root, num_episodes=8, episode_length=(20, 60), overwrite=True)
    accelerator.wait_for_everyone()
    return root


def main(argv=None) -> None:
    args = parse_args(argv)
    accelerator = Accelerator()
    out = Path(args.output_dir)
    checkpoint = out / "checkpoint"
    root = ensure_dataset(args, accelerator)

    dataset = EpisodeStreamingDataset(root, episode_pool_size=args.pool_size, seed=0,
                                      delta_timestamps=None)  # add your policy's windows here
    if args.loader == "episode":
        loader = EpisodeLoader(dataset, args.batch_size, num_threads=args.num_threads)
    else:
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers)
    camera = dataset.typed_meta.video_keys[0]
    state_dim = dataset.typed_meta.features["observation.state"].shape[0]
    action_dim = dataset.typed_meta.features["action"].shape[0]
    model = TinyPolicy(state_dim, action_dim)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)  # never the loader: the dataset shards itself

    batches_done = 0  # batches consumed in the current epoch, counted from its start
    step = 0
    if (checkpoint / "stream_state.json").exists():
        accelerator.load_state(str(checkpoint))
        saved = json.loads((checkpoint / "stream_state.json").read_text())
        # Either loader resumes either's state (elastically when ranks or workers changed).
        (loader if args.loader == "episode" else dataset).load_state_dict(saved["stream"])
        step, batches_done = saved["step"], saved["stream"]["batches_consumed"]
        accelerator.print(f"resumed at step {step}: epoch {saved['stream']['epoch']}, "
                          f"batch {batches_done} of that epoch")

    def save() -> None:
        accelerator.save_state(str(checkpoint))
        if accelerator.is_main_process:  # every rank's stream state is the same file
            # EpisodeLoader knows its position; a DataLoader needs the trainer's batch count.
            stream = loader.state_dict() if args.loader == "episode" else stream_state(loader, batches_done)
            state = {"step": step, "stream": stream}
            (checkpoint / "stream_state.json").write_text(json.dumps(state))
        accelerator.wait_for_everyone()

    accelerator.print(f"world size {accelerator.num_processes} ({accelerator.distributed_type.value}): each rank "
                      f"streams {len(dataset)} samples an epoch"
                      + ("; one process: for several on CPU, see this script's docstring"
                         if accelerator.num_processes == 1 else ""))
    indices: list[int] = []
    frames_per_sample = len(dataset.typed_meta.video_keys)
    start_epoch = dataset.epoch
    for epoch in range(start_epoch, args.epochs):
        start, samples = time.perf_counter(), 0
        for batch in loader:
            batches_done += 1
            samples += len(batch["index"])
            if args.record_indices:
                indices += batch["index"].tolist()
            if not args.dummy:
                image = batch[camera].to(accelerator.device)
                state = batch["observation.state"].to(accelerator.device)
                loss = nn.functional.mse_loss(model(image, state), batch["action"].to(accelerator.device))
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            step += 1
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save()
            if args.max_steps and step >= args.max_steps:
                break
        elapsed_s = time.perf_counter() - start
        node_samples = accelerator.reduce(torch.tensor(samples, device=accelerator.device), "sum").item()
        accelerator.print(f"epoch {epoch}: {node_samples} samples in {elapsed_s:.1f} s, "
                          f"{node_samples / elapsed_s:.1f} samples/s, "
                          f"{node_samples * frames_per_sample / elapsed_s:.1f} frames/s (all "
                          f"{accelerator.num_processes} ranks)")
        if args.max_steps and step >= args.max_steps:
            break
        batches_done = 0
    if args.record_indices:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"indices-rank{accelerator.process_index}.json").write_text(
            json.dumps({"rank": accelerator.process_index, "world_size": accelerator.num_processes,
                        "len": len(dataset), "indices": indices}))
    if args.loader == "episode":
        loader.close()  # joins its decode threads now, not at interpreter exit
    # A barrier before exit: gloo frees a finished all-reduce (dropping its tensors, which needs the
    # GIL) on its own thread after the caller's wait returns; if the interpreter is already
    # finalizing, that thread aborts the rank ("terminate called without an active exception",
    # 2-4 launches in 10 here, gdb: ProcessGroupGloo::runLoop in ~AsyncAllreduceWork). Waiting in
    # the barrier releases the GIL, so the free happens first.
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
