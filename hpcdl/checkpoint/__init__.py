"""hpcdl.checkpoint - every checkpoint hpcdl writes and reads, in one format.

    files.py     the on-disk format: a save directory of rank files and a
                 manifest (size + sha256 of each), written last; naming,
                 finding the newest complete save, pruning the others
    root.py      the trainer's checkpoint.pt (rank 0, atomic rename: it
                 commits the save), what a resuming run is checked against,
                 and the save directories beside it (SaveDirs)
    zero.py      sharded saves of pieces by parameter name (a stage-3 model,
                 any plain optimizer over its pieces), loaded into any cut
    buckets.py   the same for a stage 1-2 DistributedOptimizer's buckets
    reshard.py   the re-shard step: any save as the whole model and optimizer
                 by parameter name, and from that the whole (stages 0-2) or
                 this rank's pieces (stage 3, stages 1-2's buckets)

Every file goes through hpcdl/utils/atomic.py. The protocol with the
trainer (hpcdl/train/trainer.py): a strategy's save(dirs) writes its state
into a fresh save directory through dirs (root.SaveDirs) and returns
checkpoint.pt's entries naming it; restore(state, dirs) reads it back
through this package, whichever --zero stage and rank count wrote it.
Elastic commits (hpcdl/torch/elastic/_store.py) are one-file saves of files.py.
Imported by module (`from hpcdl.checkpoint import zero`): this file imports
nothing, so the format is usable without torch's ZeRO code.
"""
