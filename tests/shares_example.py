"""A three-level shares file the shares tests share: research 3 (vision 1 with alice 1 and
dave 3, nlp 2 with bob), prod 1 (carol), and eve, whom the file does not name, at the root."""

from __future__ import annotations

THREE_LEVELS = """\
[accounts.research]
tickets = 3
[accounts."research/vision"]
tickets = 1
[accounts."research/nlp"]
tickets = 2
[accounts.prod]
tickets = 1
[users.alice]
account = "research/vision"
tickets = 1
[users.dave]
account = "research/vision"
tickets = 3
[users.bob]
account = "research/nlp"
tickets = 1
[users.carol]
account = "prod"
tickets = 1
"""
EVERYONE = ("alice", "dave", "bob", "carol", "eve")
