"""ps_ssp_asp_check.py S - run under mpirun (3+ ranks, 1 server): bad settings
fail on every rank; SSP with bound S and worker 0 slowed by time.sleep never
lets a worker run more than S steps ahead (replayed from the server's recorded
pushes and answers, and from the workers' own records) and does reach the
bound; ASP with the same slow worker finishes every step and learns digits; workers
making different numbers of steps in a round get an error, not a hang."""
import sys

import torch
import torch.nn.functional as F

from ps_common import DS, N, R, check, mlp, run_round, say, verdict
from hpcdl.ps import PSConfigError, PSTrainer
from hpcdl.ps.clock import replay

S = int(sys.argv[1])
W = N - 1
G = 16 * W
SLOW = 0.05  # seconds worker 0 sleeps before each step

# 1. bad settings: the same clear error on every rank, before any message
for kwargs, words in ((dict(mode="ssp", staleness=-1), "--staleness is -1"),
                      (dict(mode="bsp", ps_ranks=N), "--ps-ranks %d leaves no worker" % N),
                      (dict(mode="asp", ps_ranks=0), "--ps-ranks is 0"),
                      (dict(mode="ssp"), "needs --staleness"),
                      (dict(mode="asp", staleness=2), "only applies to ps-ssp"),
                      (dict(mode="sync"), "unknown parameter-server mode")):
    try:
        PSTrainer.create(mlp(), **kwargs)
        check(False, "%s: no error" % kwargs)
    except PSConfigError as e:
        check(words in str(e), "%s: message %r lacks %r" % (kwargs, str(e), words))

# 2. SSP(S) with a slow worker: the bound holds and is reached
ssp = PSTrainer.create(mlp(), mode="ssp", staleness=S, momentum=0.9, record=True)
run_round(ssp, 1, G, 12, sleep=SLOW if ssp.worker_rank == 0 else 0.0)
stats = ssp.gather_stats()
lags = replay(stats[0]["events"], W)
check(len(lags) == 12 * W, "server answered %d pulls, want %d" % (len(lags), 12 * W))
check(max(lag for _, _, lag in lags) <= S, "SSP(%d) answered a pull %d steps ahead"
      % (S, max(lag for _, _, lag in lags)))
check(max(lag for _, _, lag in lags) == S, "SSP(%d) never reached its bound: lags %s"
      % (S, sorted({lag for _, _, lag in lags})))
for st in stats[1:]:
    check(st["clock"] == 12 and st["max_staleness"] <= S, "SSP worker %d: clock %d, max "
          "staleness %d" % (st["worker"], st["clock"], st["max_staleness"]))
if R == 0:
    say("SSP(%d), worker 0 sleeping %gs a step: lag per answered pull %s, held pulls %d"
        % (S, SLOW, [lag for _, _, lag in lags], stats[0]["held_pulls"]))


# 3. ASP with the same slow worker: every step is taken and the model learns
def test_accuracy(model):
    with torch.no_grad():
        return (model(DS.x_test).argmax(1) == DS.y_test).float().mean().item()


asp = PSTrainer.create(mlp(), mode="asp", momentum=0.9)
start_loss = F.cross_entropy(asp.model(DS.x_train), DS.y_train).item()
for epoch in (1, 2, 3):
    run_round(asp, epoch, G, 1000, sleep=0.005 if asp.worker_rank == 0 else 0.0)
asp.sync_model()
end_loss = F.cross_entropy(asp.model(DS.x_train), DS.y_train).item()
acc = test_accuracy(asp.model)
steps = 3 * (len(DS.y_train) // G)
for st in asp.gather_stats()[1:]:
    check(st["clock"] == steps, "ASP worker %d made %d steps, want %d"
          % (st["worker"], st["clock"], steps))
    if R == 0:
        say("ASP worker %d: %d steps, max staleness %d, waited %.2fs"
            % (st["worker"], st["clock"], st["max_staleness"], st["wait_s"]))
check(end_loss < 0.5 * start_loss, "ASP training loss %.3f -> %.3f" % (start_loss, end_loss))
check(acc > 0.8, "ASP test accuracy %.3f (chance 0.1)" % acc)
if R == 0:
    say("ASP: training loss %.3f -> %.3f, test accuracy %.3f" % (start_loss, end_loss, acc))

# 4. misuse: worker 0 ends its round after 3 steps, the others try 5 under SSP(0).
# They could never be answered: the server and the waiting workers raise, no hang.
bad = PSTrainer.create(mlp(), mode="ssp", staleness=0)
try:
    run_round(bad, 1, G, 3 if bad.worker_rank == 0 else 5)
    check(bad.worker_rank == 0, "unequal rounds: no error on rank %d" % R)
except RuntimeError as e:
    check(bad.worker_rank != 0, "worker 0 finished its steps but got: %s" % e)
    check("same number of steps" in str(e), "unclear error: %s" % e)
    if R in (0, N - 1):
        say("unequal rounds: %s" % e)
for ps in (ssp, asp, bad):
    ps.close()
sys.exit(1 if verdict() else 0)
