"""test_goodput.py - Pollux-style goodput (hpcdl/optim/goodput.py) against a
table worked by hand, and the choice growing with B_noise. Pure (no MPI)."""
import pytest

from hpcdl.optim import goodput as gp

# 2 ranks, base batch 32, ceiling 256; t(L) = 0.01 + 0.0001 L + 0.02 comm:
#   M    L   t        throughput  | eff at B_noise 0    8       32      96
#   32   16  0.0316   1012.658    |           1       1       1       1
#   64   32  0.0332   1927.711    |        0.5   40/72   64/96  128/160
#   128  64  0.0364   3516.484    |       0.25  40/136  64/160  128/224
#   256 128  0.0428   5981.308    |      0.125  40/264  64/288  128/352
# goodput (throughput x eff):
#   B_noise 0:  1012.66   963.86   879.12   747.66  -> 32
#   B_noise 8:  1012.66  1070.95  1034.26   906.26  -> 64
#   B_noise 32: 1012.66  1285.14  1406.59  1329.18  -> 128
#   B_noise 96: 1012.66  1542.17  2009.42  2175.02  -> 256
MODEL = gp.StepTime(a=0.01, c=0.0001, comm=0.02)
CANDS = gp.candidates(2, 32, 256)
HAND = {0: ([1012.66, 963.86, 879.12, 747.66], 32),
        8: ([1012.66, 1070.95, 1034.26, 906.26], 64),
        32: ([1012.66, 1285.14, 1406.59, 1329.18], 128),
        96: ([1012.66, 1542.17, 2009.42, 2175.02], 256)}


def test_candidates_and_step_times_by_hand():
    assert CANDS == [(32, 16, 1), (64, 32, 1), (128, 64, 1), (256, 128, 1)]
    assert [MODEL(l, k) for _, l, k in CANDS] == pytest.approx([0.0316, 0.0332, 0.0364, 0.0428])
    # the ceiling need not be a candidate; the base batch always is
    assert gp.candidates(2, 32, 200) == CANDS[:3]
    assert gp.candidates(2, 32, 16) == [(32, 16, 1)]


@pytest.mark.parametrize("b_noise", sorted(HAND))
def test_goodput_table_and_choice_by_hand(b_noise):
    rows = gp.table(b_noise, 32, MODEL, CANDS)
    goodputs, choice = HAND[b_noise]
    assert [r["goodput"] for r in rows] == pytest.approx(goodputs, abs=0.01)
    assert rows[0]["efficiency"] == 1.0
    assert gp.best(rows)["global_batch"] == choice


def test_choice_grows_with_the_noise_scale():
    picks = [gp.best(gp.table(b, 32, MODEL, CANDS))["global_batch"]
             for b in (0, 1, 4, 8, 16, 32, 64, 96, 1000)]
    assert picks == sorted(picks) and picks[0] == 32 and picks[-1] == 256


def test_no_estimate_counts_as_no_noise():
    rows = gp.table(None, 32, MODEL, CANDS)
    assert [r["efficiency"] for r in rows] == [1, 0.5, 0.25, 0.125]
    assert gp.best(rows)["global_batch"] == 32


def test_accumulation_keeps_the_local_batch_under_its_limit():
    cands = gp.candidates(2, 32, 256, max_local=32)
    assert cands == [(32, 16, 1), (64, 32, 1), (128, 32, 2), (256, 32, 4)]
    # 4 passes of 32 and one all-reduce: 4 x (0.01 + 0.0032) + 0.02
    assert MODEL(32, 4) == pytest.approx(0.0728)
    row = gp.table(96, 32, MODEL, cands)[-1]
    assert row["goodput"] == pytest.approx(256 / 0.0728 * 128 / 352)


def test_fit_line_by_hand():
    assert gp.fit_line([(16, 0.0116), (64, 0.0164)]) == pytest.approx((0.01, 0.0001))
    assert gp.fit_line([(16, 0.0116), (64, 0.0164), (40, 0.014)]) == \
        pytest.approx((0.01, 0.0001))
    assert gp.fit_line([(8, 0.5), (8, 0.7)]) == pytest.approx((0.6, 0.0))
    assert gp.fit_line([(8, 0.5), (16, 0.3)]) == pytest.approx((0.4, 0.0))  # c < 0 -> 0
    with pytest.raises(ValueError):
        gp.fit_line([])


def test_bad_arguments():
    with pytest.raises(ValueError, match="divide"):
        gp.candidates(3, 32, 256)
    with pytest.raises(ValueError, match="batch"):
        gp.efficiency(1.0, 0, 32)
