"""Jobs that run to completion over files, beside the web app (``medclr.app``, serving only): the demo pipeline
(``demo``: phantom -> LM -> train -> eval -> index -> app, each step a `medclr` command) and archive scoring
(``scoring``, with its command in ``score``). They use the core, never the app or each other."""
