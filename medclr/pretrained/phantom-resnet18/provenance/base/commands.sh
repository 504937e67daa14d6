# The reference model phantom-resnet18: how it was made (medclr's own recipe on CXR-Phantom, seed 0 throughout).
# The data, the domain LM and the eta table are `medclr demo`'s first four steps, as its --train path runs them;
# the phantom and the LM folders were made by those same commands for the replication campaign
# (bench/paper_replication.py, preset cpu) and copied, not regenerated.
medclr phantom --out WORK/phantom --n 3000 --seed 0 --source both --eval-per-class 250 --eval-normal 0   # made before the test split had normal studies; same training pool with them
medclr prepare --mimic WORK/phantom --views all --mscxr WORK/phantom/MS_CXR_Local_Alignment_v1.1.0.csv --out WORK/manifest.parquet
medclr lm fit --manifest WORK/manifest.parquet --out WORK/lm
medclr lm score --manifest WORK/manifest.parquet --model WORK/lm --out WORK/eta.parquet
# the training (training/configs/preset_reference.yaml: 3,000 steps, seed 0), resumed across sittings with the
# same command (the demo adds --resume when WORK/checkpoint/checkpoints holds a step); then eval and the index
medclr demo --train --preset reference --workdir WORK --no-serve
# equivalent to:
#   medclr train --config dcl_lm preset=reference data.manifest=WORK/manifest.parquet data.eta=WORK/eta.parquet out=WORK/checkpoint [--resume]
#   medclr eval --checkpoint WORK/checkpoint --manifest WORK/manifest.parquet --out WORK/report
# Steps 0-1,800 ran on commits before 9448724, whose reference preset validated with the paper's prompts; from step
# 1,800 on it ran at 9448724 and later, whose preset adds `val.prompts: report`. That key is read only by the
# validation hook (which prompts it scores, which prompts the findings record calibrates); no optimisation step
# reads it, so the weights are those of one uninterrupted run (resume is exact). The per-finding record and the
# stored prompt embeddings are the report-style set's.
# The shipped report: the phantom `medclr demo` makes (its test split with 50 normal studies), evaluated with the
# checkpoint's own (report-style) prompts, then packed in float16:
medclr phantom --out DEMO/phantom --n 3000 --seed 0 --source both --eval-per-class 250
medclr prepare --mimic DEMO/phantom --views all --mscxr DEMO/phantom/MS_CXR_Local_Alignment_v1.1.0.csv --out DEMO/manifest.parquet
medclr eval --checkpoint WORK/checkpoint --manifest DEMO/manifest.parquet --out WORK/report_demo
medclr models pack WORK/checkpoint --name phantom-resnet18 --fp16 --provenance WORK/provenance --report WORK/report_demo --description "..."
