# The reference model phantom-resnet18 (second version, 2026-12-06): how it was made, seed 0 throughout.
# Two stages. Stage 1 is the first shipped phantom-resnet18 (base/: its commands, commit, training log, trainer
# state and test-split report): the reference preset, 3,000 steps from scratch, stride 16 (an 8x8 grid).
# Stage 2 continues its float16-packed weights (SHA-256 fb5225ee5ac5..., loaded into float32) for 900 steps with the
# last two ResNet stages unstrided (model.output_stride=8: a 16x16 grid at 128 px crops), the reference recipe
# otherwise unchanged, on the same data. WORK is `medclr demo`'s phantom and the first four steps of its --train path:
medclr phantom --out WORK/phantom --n 3000 --seed 0 --source both --eval-per-class 250
medclr prepare --mimic WORK/phantom --views all --mscxr WORK/phantom/MS_CXR_Local_Alignment_v1.1.0.csv --out WORK/manifest.parquet
medclr lm fit --manifest WORK/manifest.parquet --out WORK/lm          # the same word pieces as stage 1's tokenizer (checked by model.init)
medclr lm score --manifest WORK/manifest.parquet --model WORK/lm --out WORK/eta.parquet
# stage 2 (training.log; 2 CPU cores with AVX512-BF16, bf16 autocast):
medclr train --config dcl_lm preset=reference model.init=STAGE1 \
  data.manifest=WORK/manifest.parquet data.eta=WORK/eta.parquet out=WORK/s8 \
  model.output_stride=8 train.max_steps=900 optim.lr=2e-4 optim.lr_text=4e-5 optim.warmup_steps=20
# STAGE1 = the first phantom-resnet18's folder (git show 8e65ef5:medclr/pretrained/phantom-resnet18/..., or
# `medclr demo --train --preset reference` then `medclr models pack ... --fp16` to remake it).
# The shipped report: the test split of that phantom (1,450 studies, 50 normal), the checkpoint's own report-style prompts:
medclr eval --checkpoint WORK/s8 --manifest WORK/manifest.parquet --out WORK/s8_report
medclr models pack WORK/s8 --name phantom-resnet18 --fp16 --overwrite --provenance PROV --report WORK/s8_report --description "..."
