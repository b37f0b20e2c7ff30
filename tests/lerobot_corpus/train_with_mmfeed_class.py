r"""LeRobot's own training entry point (``lerobot-train``) with ``mmfeed.lerobot.LeRobotDataset`` in place of
LeRobot's dataset class: the "change one import" check, run by hand in a LeRobot 0.4.4 venv (the recipe in
``mmfeed.bench.lerobot_compare``, plus the training dependencies LeRobot declares: imageio, deepdiff, gymnasium,
pyserial, wandb, diffusers, opencv-python-headless, pynput) that sees mmfeed::

    HF_HUB_OFFLINE=1 WANDB_MODE=disabled LD_LIBRARY_PATH=/work/lerobot-venv/ffmpeg-links \
        /work/lerobot-venv/bin/python tests/lerobot_corpus/train_with_mmfeed_class.py \
        --dataset.repo_id=local/rowgroups --dataset.root=tests/lerobot_corpus/rowgroups --policy.type=act \
        --policy.device=cpu --policy.pretrained_backbone_weights=null --policy.push_to_hub=false --steps=4 \
        --batch_size=4 --num_workers=2 --save_checkpoint=false --wandb.enable=false --eval_freq=0 --log_freq=1

Every argument is ``lerobot-train``'s. LeRobot's dataset factory builds its metadata and dataset from the names it
imported, so both are replaced there; the policy is then built from ``dataset.meta`` (features, stats) and trained
on batches of ``torch.utils.data.DataLoader`` over mmfeed's class. On the corpus's ``rowgroups`` with ACT the
four steps' losses (74.662, 59.836, 42.969, 34.997) were those of the same command with LeRobot's own class, with
0 and 2 workers.
"""

import sys

import lerobot.datasets.factory as factory

import mmfeed.lerobot


def metadata(repo_id, root=None, revision=None, **_):
    return mmfeed.lerobot.LeRobotDatasetMetadata(repo_id, root=root, revision=revision)


def main() -> None:
    factory.LeRobotDataset = mmfeed.lerobot.LeRobotDataset
    factory.LeRobotDatasetMetadata = metadata
    from lerobot.scripts.lerobot_train import main as train

    sys.argv = ["lerobot-train", *sys.argv[1:]]
    train()


if __name__ == "__main__":
    main()
