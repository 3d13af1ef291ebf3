"""The core: verification rules and everything they are judged by, with no audit machinery.

rules (the verification rules), processing (temperature / top-k / top-p / min-p), chains (toy
language models with exact laws), exact (exact step and sequence laws by integration over the
uniforms), stats (calibrated goodness of fit, power, family-wise budgets), speedup (the analytic
speedup model), seeding (seeds derived from a check's parameters).
"""
