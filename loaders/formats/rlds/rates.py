"""The published control rates of the Open X-Embodiment datasets, the default ``fps`` of an RLDS dataset whose
name is among them.

RLDS records no control rate. The Open X-Embodiment dataset overview spreadsheet gives each dataset's "Control
Frequency" in Hz; :data:`OXE_RATES` holds that column by TFDS dataset name: the folder name in the public bucket
(``gs://gresearch/robotics/<name>/<version>``), which is the ``name`` its ``dataset_info.json`` records (DROID's
folders record ``r2d2_faceblur`` and ``droid_101``: both are here too). The values are the spreadsheet's as
LeRobot's Open X-Embodiment conversion copied them, and, for the datasets it leaves out, as other published copies
of the spreadsheet's rows give them where they agree. Left out: the datasets whose row gives no number
(``stanford_mask_vit_converted_externally_to_rlds``: "actions are run until robot comes to rest";
``vima_converted_externally_to_rlds``: primitive skills; ``tidybot``), and ``io_ai_tech`` and ``spoc``, whose
published copies disagree (3 or 30 Hz; 3 or 10 Hz). Those open without a rate, as any other RLDS dataset does:
``fps=`` gives it, and ``fps=`` overrides the table wherever it is given.
"""

from __future__ import annotations

__all__ = ["OXE_RATES", "published_rate"]

OXE_RATES: dict[str, float] = {
    "fractal20220817_data": 3.0,  # RT-1 Robot Action
    "kuka": 10.0,  # QT-Opt
    "bridge": 5.0,  # Berkeley Bridge (BridgeData V2)
    "bridge_dataset": 5.0,  # the same BridgeData V2, as its authors release it in RLDS
    "taco_play": 15.0,  # Freiburg Franka Play
    "jaco_play": 10.0,
    "berkeley_cable_routing": 10.0,
    "roboturk": 10.0,
    "nyu_door_opening_surprising_effectiveness": 3.0,  # NYU VINN
    "viola": 20.0,  # Austin VIOLA
    "berkeley_autolab_ur5": 5.0,
    "toto": 30.0,
    "language_table": 10.0,
    "columbia_cairlab_pusht_real": 10.0,
    "stanford_kuka_multimodal_dataset_converted_externally_to_rlds": 20.0,
    "nyu_rot_dataset_converted_externally_to_rlds": 3.0,
    "stanford_hydra_dataset_converted_externally_to_rlds": 10.0,
    "austin_buds_dataset_converted_externally_to_rlds": 20.0,
    "nyu_franka_play_dataset_converted_externally_to_rlds": 3.0,
    "maniskill_dataset_converted_externally_to_rlds": 20.0,
    "furniture_bench_dataset_converted_externally_to_rlds": 10.0,
    "cmu_franka_exploration_dataset_converted_externally_to_rlds": 10.0,
    "ucsd_kitchen_dataset_converted_externally_to_rlds": 2.0,
    "ucsd_pick_and_place_dataset_converted_externally_to_rlds": 3.0,
    "austin_sailor_dataset_converted_externally_to_rlds": 20.0,
    "austin_sirius_dataset_converted_externally_to_rlds": 20.0,
    "bc_z": 10.0,
    "usc_cloth_sim_converted_externally_to_rlds": 10.0,
    "utokyo_pr2_opening_fridge_converted_externally_to_rlds": 10.0,
    "utokyo_pr2_tabletop_manipulation_converted_externally_to_rlds": 10.0,
    "utokyo_saytap_converted_externally_to_rlds": 50.0,
    "utokyo_xarm_pick_and_place_converted_externally_to_rlds": 10.0,
    "utokyo_xarm_bimanual_converted_externally_to_rlds": 10.0,
    "robo_net": 1.0,
    "robo_set": 5.0,
    "berkeley_mvp_converted_externally_to_rlds": 5.0,
    "berkeley_rpt_converted_externally_to_rlds": 30.0,
    "kaist_nonprehensile_converted_externally_to_rlds": 10.0,
    "tokyo_u_lsmo_converted_externally_to_rlds": 10.0,
    "dlr_sara_pour_converted_externally_to_rlds": 10.0,
    "dlr_sara_grid_clamp_converted_externally_to_rlds": 10.0,
    "dlr_edan_shared_control_converted_externally_to_rlds": 5.0,
    "asu_table_top_converted_externally_to_rlds": 12.5,
    "stanford_robocook_converted_externally_to_rlds": 5.0,
    "eth_agent_affordances": 66.6,
    "imperialcollege_sawyer_wrist_cam": 10.0,
    "iamlab_cmu_pickup_insert_converted_externally_to_rlds": 20.0,
    "qut_dexterous_manpulation": 30.0,  # the bucket's spelling
    "uiuc_d3field": 1.0,
    "utaustin_mutex": 20.0,
    "berkeley_fanuc_manipulation": 10.0,
    "cmu_playing_with_food": 10.0,  # CMU Food Manipulation
    "cmu_play_fusion": 5.0,
    "cmu_stretch": 10.0,
    "berkeley_gnm_recon": 3.0,
    "berkeley_gnm_cory_hall": 5.0,
    "berkeley_gnm_sac_son": 10.0,
    "robot_vqa": 10.0,
    "droid": 15.0,
    "droid_100": 15.0,  # DROID's 100-episode sample
    "r2d2_faceblur": 15.0,  # the name dataset_info.json gives DROID 1.0.0 (droid/ and droid_100/)
    "droid_101": 15.0,  # the name dataset_info.json gives DROID 1.0.1
    "fmb": 10.0,
    "dobbe": 3.75,
    "mimic_play": 15.0,
    "aloha_mobile": 50.0,
    "plex_robosuite": 20.0,
    "conq_hose_manipulation": 30.0,
}
"""Control frequency in Hz by TFDS dataset name, from the Open X-Embodiment spreadsheet's "Control Frequency"
column."""


def published_rate(name: str) -> float | None:
    """The published control frequency (Hz) of the Open X-Embodiment dataset whose TFDS name is ``name``
    (exactly as ``dataset_info.json`` records it), None for a name the table does not hold."""
    return OXE_RATES.get(name)
