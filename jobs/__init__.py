"""Jobs that run to completion over files, beside the web app (``medclr.app``, serving only): the demo pipeline
(``demo``: phantom -> LM -> train -> eval -> index -> app, each step a `medclr` command) and archive scoring
(``scoring``, with its command in ``score``), and the retrieval index's command (``index``: a checkpoint's
embeddings into ``medclr.index``). They use the core, never the app or each other."""
