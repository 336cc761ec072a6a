"""benchmarks/train_memory.py: the batch each GPU takes, from the counts of a step at two batches and the GPU run's
calibration."""
import pytest


@pytest.fixture(scope='module')
def train_memory():
    from benchmarks import train_memory  # as python -m benchmarks.train_memory imports it, Triton under its interpreter
    return train_memory


def test_the_largest_batch_fits_and_one_more_does_not(train_memory):
    """The step's peak linear in the images between the two counts, taken as many times as the GPU run held over
    the count (here the one config both ran: 6,099 MiB at 2 images against 4,000 counted)."""
    mib = 2 ** 20
    counts = [dict(config='mask_rcnn_mala_s', precision='fp16', input='1333x800', parameters_m=44.2, recipe_batch=2,
                   state=500 * mib, peaks={1: 3000 * mib, 2: 4000 * mib})]
    rows, factor, ratios = train_memory.table_rows(counts)
    assert ratios == {'mask_rcnn_mala_s': pytest.approx(6099 / 4000)} and factor == ratios['mask_rcnn_mala_s']
    row = rows[0]
    assert row['per_image_mib'] == 1000 and row['recipe_gib'] == pytest.approx(4500 / 1024)

    def held_gib(images):
        return train_memory.UNCOUNTED_GIB + (500 + factor * (2000 + images * 1000)) / 1024
    for gib in train_memory.GPUS_GIB:
        batch = row[f'batch_{gib}gb']
        assert held_gib(batch) <= gib < held_gib(batch + 1), gib
