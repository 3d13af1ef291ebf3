"""How long the property tests that call the implementation take, for the estimate ``specverify
properties`` prints before it starts.

:data:`MEASURED_S`: each test's call time in seconds (``pytest --durations=0``), measured with
``examples/vectorized_verify.py:verify`` as the implementation, ``-n 2``, on 2 CPU cores shared with other
jobs at a load of 8–10; the run took 120 s, :data:`STARTUP_S` of it starting the workers and
collecting.  An implementation slower than that one scales the sampled tests' share.
"""

from __future__ import annotations

MEASURED_S: dict[str, float] = {
    "test_laws.py::test_output_format_and_tokens_per_step": 14.36,
    "test_exact_properties.py::test_completed_step_law_is_the_target_law[impl]": 13.28,
    "test_laws.py::test_batched_equals_row_by_row[impl]": 8.32,
    "test_statistical.py::test_batched_rows_that_differ": 7.51,
    "test_statistical.py::test_decoding_loop_joint": 7.03,
    "test_exact_properties.py::test_whole_run_law_is_the_target_law[impl]": 6.14,
    "test_laws.py::test_acceptance_rate_is_one_minus_tv_exactly[impl]": 5.82,
    "test_statistical.py::test_long_drafts": 4.93,
    "test_laws.py::test_zero_probability_token_is_never_emitted_sampled": 4.58,
    "test_laws.py::test_zero_probability_token_is_never_emitted_exactly[impl]": 3.55,
    "test_statistical.py::test_step_joint_with_frequent_rejection": 3.03,
    "test_statistical.py::test_acceptance_rate_is_one_minus_tv": 2.74,
    "test_laws.py::test_disjoint_supports_accept_nothing_exactly[impl]": 2.54,
    "test_statistical.py::test_first_token_marginal": 2.5,
    "test_laws.py::test_identical_draft_accepts_everything_exactly[impl]": 2.23,
    "test_laws.py::test_identical_draft_accepts_everything_sampled": 2.18,
    "test_laws.py::test_disjoint_supports_accept_nothing_sampled": 1.39,
    "test_statistical.py::test_bonus_position": 1.35,
    "test_laws.py::test_same_generator_seed_reproduces": 0.06,
    "test_laws.py::test_output_depends_on_the_generator": 0.0,
}
"""Test id (``file::name[params]``) -> seconds of its call."""

STARTUP_S = 70.0
"""The measured run's time outside the tests' calls: interpreter and worker start, imports, collection."""

MEASURED_ON = "measured with examples/vectorized_verify.py on 2 shared cores at load 8-10"


def estimate(workers: int, *, whole_suite: bool = False) -> str:
    """The sentence that says how long the scoped run takes on ``workers`` processes: the longer of
    the tests' total over the workers and the longest test, plus the start-up."""
    total = sum(MEASURED_S.values())
    seconds = STARTUP_S + max(total / workers, max(MEASURED_S.values()))
    line = (
        f"estimate: {len(MEASURED_S)} tests call the implementation, {total:.0f} s of tests on {workers} "
        f"worker(s): ~{seconds / 60:.1f} min ({MEASURED_ON})"
    )
    if whole_suite:
        line += "; --whole-suite adds the suite's own calibration and catalog self-tests, not estimated"
    return line
