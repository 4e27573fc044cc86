"""Example jobs: ingest.RayStream under Ray Train's TorchTrainer (CPU or GPU, unchanged).

python -m train.lm --config train/configs/lm.yaml train.epochs=3
python -m train.image --config train/configs/image.yaml
"""
