"""What a try waiting at a gate is told when its fleet stops."""


class Cancelled(Exception):
    """A wait for a permit or a minute's budget given up: the fleet is stopping, and a try it
    has not sent yet is left to the record's next owner (no call went out, none is lost)."""
