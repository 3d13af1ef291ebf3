"""``python -m specverify.engines``: the CI audit plan of every built-in engine target, as commands."""

from specverify.engines import AUDIT_PLANS, audit_command


def main() -> None:
    for plan in AUDIT_PLANS:
        note = f"  # {plan.note}" if plan.note else ""
        print(f"{audit_command(plan)}{note}")


if __name__ == "__main__":
    main()
