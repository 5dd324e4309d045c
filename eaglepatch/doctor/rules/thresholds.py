"""The thresholds of the doctor's rules, one named constant each (docs/doctor.md lists the same)."""

ACCEPT_LOW = 1.2            # accept-length-low: every measure of the accept length at most this
GRAPH_OFF_HIGH_SHARE = 0.5  # cuda-graph-off is high when at least this share of decode lines ran without graphs
BETWEEN_SHARE = 0.4         # host-bound: the scheduler's time between cycles at least this share of the cycle
HOST_GPU_RATIO = 0.9        # host-bound: the events timer's host time at least this share of its GPU time
RANK_SKEW = 1.15            # rank-skew: the slowest rank's verify p50 at least this times the fastest one's
STEPS_GAIN = 1.05           # too-many-steps: the favoured step count at least 5% faster per token (modelled)
STEPS_MAX = 8               # too-many-steps: step counts considered: 1 .. max(this, the current + 2)
VERIFY_SHARE = 0.5          # tp-communication is medium (not low) when verify is at least this share of the cycle
SPEC_ALGOS_HIDDEN = ("EAGLE", "EAGLE3", "NEXTN")  # drafts that run on the target's hidden states
