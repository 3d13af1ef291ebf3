"""The decoder level of the audit (SPEC §2: ``generate(prompts, params, seed)``).

- ``battery.py`` — end-to-end checks on tiny models whose output law can be enumerated, and
  :class:`DecoderBattery`.
"""
