"""Rules: the facts a breakdown shows, and the one table of named rules that turns them into the
verdict, the findings, the straggler and every advice line."""
