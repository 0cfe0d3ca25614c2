"""The paper's algorithms (Gandiva_fair, EuroSys 2020), kept to compare gfair against: stride on
one GPU, gang-aware stride on one server, and split stride (a stride per server plus a central
one). The simulator's `paper-split-stride` policy runs them; no service does."""
