"""pipeline.py - the terms of pipeline parallelism: the bubble and the
point-to-point messages between stages, priced with the alpha-beta model.
Pure functions; `hpcdl sim pipeline` prints them (docs/sim.md).

A model cut into p balanced stages (one per device) runs one step's batch
of B samples as m micro-batches of B/m. Names used below:

    p      stages                  m   micro-batches per step
    f, b   one stage's forward / backward time for one micro-batch
           (balanced stages: f = C_f / (p m), b = C_b / (p m), where C_f + C_b
           is the whole model's compute for the whole batch on one device)
    A      bytes crossing a stage boundary per micro-batch, each way: the
           activation forward, its gradient back (B/m samples x E elements
           per sample x bytes per element)
    c      one message: alpha + A beta (the link of each boundary carries one
           message at a time; sends do not stop the sender computing)

GPipe runs all forwards, then all backwards. A phase (forward, then
backward, with t = f or b) ends when the last micro-batch has crossed all
p stages; micro-batches follow each other at the pace of the slower of the
stage and the link:

    phase(t) = t + (p - 1)(c + t) + (m - 1) max(t, c)
    step     = phase(f) + phase(b)
             = (m + p - 1)(f + b) + 2 (p - 1) c      while c <= f and c <= b

Each stage computes m (f + b) per step, so with free messages the idle
share of every stage is the bubble

    bubble = (p - 1)(f + b) / ((m + p - 1)(f + b)) = (p - 1) / (m + p - 1).

1F1B (one forward, one backward, after p - s warm-up forwards on stage s)
has the same bubble with free messages (tutorial 10 replays both); it keeps
at most min(m, p - s) micro-batches' activations on stage s against
GPipe's m. With messages its step is close to GPipe's, not equal (a
backward may wait for a gradient that a forward delays); the model
prices GPipe.
"""


def _positive_int(value, what):
    if int(value) != value or value < 1:
        raise ValueError("%s must be a positive integer (got %r)" % (what, value))
    return int(value)


def _non_negative(value, what):
    if value < 0:
        raise ValueError("%s must be >= 0 (got %r)" % (what, value))
    return value


def bubble_fraction(p, m):
    """(p - 1) / (m + p - 1): the share of a step each stage idles in GPipe
    (and 1F1B) with balanced stages and free messages; 0 for one stage."""
    p, m = _positive_int(p, "the number of stages"), _positive_int(m, "the number of "
                                                                      "micro-batches")
    return (p - 1) / (m + p - 1)


def boundary_bytes(batch, m, elements_per_sample, bytes_per_element=4):
    """A: bytes one micro-batch sends across one stage boundary, each way
    (B/m samples x E elements x bytes; m need not divide B: the mean size)."""
    _positive_int(batch, "the batch")
    m = _positive_int(m, "the number of micro-batches")
    _non_negative(elements_per_sample, "the activation elements per sample")
    _positive_int(bytes_per_element, "the bytes per element")
    return batch / m * elements_per_sample * bytes_per_element


def message_time(nbytes, alpha, beta):
    """c = alpha + A beta: one point-to-point message of A bytes."""
    _non_negative(nbytes, "the message size")
    return _non_negative(alpha, "alpha") + nbytes * _non_negative(beta, "beta")


def phase_time(p, m, t, c):
    """One GPipe phase: t + (p - 1)(c + t) + (m - 1) max(t, c), where t is one
    stage's time per micro-batch (f or b) and c one message's (none for p = 1)."""
    p, m = _positive_int(p, "the number of stages"), _positive_int(m, "the number of "
                                                                      "micro-batches")
    t, c = _non_negative(t, "the stage time"), _non_negative(c, "the message time")
    if p == 1:
        c = 0.0  # one stage: no boundary, no message
    return t + (p - 1) * (c + t) + (m - 1) * max(t, c)


def step_time(p, m, f, b, c):
    """A GPipe step: phase(f) + phase(b); (m + p - 1)(f + b) + 2 (p - 1) c
    while the link keeps up (c <= f, b)."""
    return phase_time(p, m, f, c) + phase_time(p, m, b, c)


def peak_activations(schedule, p, m, stage=0):
    """Micro-batches whose activations stage `stage` keeps at once: GPipe m,
    1F1B min(m, p - stage) (its warm-up forwards)."""
    p, m = _positive_int(p, "the number of stages"), _positive_int(m, "the number of "
                                                                      "micro-batches")
    if int(stage) != stage or not 0 <= stage < p:
        raise ValueError("stage must be 0..%d (got %r)" % (p - 1, stage))
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(m, p - int(stage))
    raise ValueError("schedule must be gpipe or 1f1b (got %r)" % (schedule,))


def predict(p, m, compute_s, batch, elements_per_sample, alpha, beta, backward_share=2 / 3,
            bytes_per_element=4):
    """One row of `hpcdl sim pipeline`: a GPipe step of p balanced stages and m
    micro-batches, where compute_s is the whole model's forward + backward on
    the whole batch on one device (backward_share of it backward). Returns a
    dict of seconds and bytes; `ideal` is compute_s / p (no bubble, free
    messages) and efficiency = ideal / step."""
    _non_negative(compute_s, "the compute time")
    if not 0 <= backward_share <= 1:
        raise ValueError("the backward share must be in 0..1 (got %r)" % (backward_share,))
    bubble = bubble_fraction(p, m)
    f = compute_s * (1 - backward_share) / (p * m)
    b = compute_s * backward_share / (p * m)
    nbytes = boundary_bytes(batch, m, elements_per_sample, bytes_per_element)
    c = message_time(nbytes, alpha, beta)
    step = step_time(p, m, f, b, c)
    ideal = compute_s / p
    return {"stages": p, "micro_batches": m, "bubble": bubble, "forward_s": f,
            "backward_s": b, "message_bytes": nbytes, "message_s": c,
            "p2p_bytes_per_step": 2 * m * nbytes, "step_s": step, "ideal_s": ideal,
            "efficiency": ideal / step if step > 0 else 1.0,
            "link_bound": c > min(f, b),
            "activations_gpipe": peak_activations("gpipe", p, m),
            "activations_1f1b": peak_activations("1f1b", p, m)}
