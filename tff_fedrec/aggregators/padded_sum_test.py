import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedrec.aggregators import padded_sum
from tff_fedrec.programs import execution


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


_VALUE = tff.TensorType(np.float32, [3, None])

# Hand-built uploads of a [3, None] value, one per width 2, 4 and 8.
_WIDTH_2 = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
_WIDTH_4 = np.array(
    [[10, 20, 30, 40], [50, 60, 70, 80], [90, 100, 110, 120]], np.float32
)
# 100 * (column + 1) on every row.
_WIDTH_8 = np.tile(100 * np.arange(1, 9, dtype=np.float32), [3, 1])


def _run(uploads, output_widths=(2, 4, 8), value_type=_VALUE):
  process = padded_sum.PaddedSumFactory(output_widths).create(value_type)
  return process.next(process.initialize(), uploads)


def test_each_width_gets_its_slice_of_the_padded_sum():
  output = _run([_WIDTH_2, _WIDTH_4, _WIDTH_8])
  # Column by column, each client adds where its upload reaches; e.g. row 0
  # is [1+10+100, 2+20+200, 30+300, 40+400, 500, 600, 700, 800].
  padded_sum_of_uploads = np.array(
      [
          [111, 222, 330, 440, 500, 600, 700, 800],
          [153, 264, 370, 480, 500, 600, 700, 800],
          [195, 306, 410, 520, 500, 600, 700, 800],
      ],
      np.float32,
  )
  small, medium, large = output.result
  np.testing.assert_array_equal(small, padded_sum_of_uploads[:, :2])
  np.testing.assert_array_equal(medium, padded_sum_of_uploads[:, :4])
  np.testing.assert_array_equal(large, padded_sum_of_uploads)
  assert [small.shape, medium.shape, large.shape] == [(3, 2), (3, 4), (3, 8)]
  np.testing.assert_array_equal(
      output.measurements['clients_per_width'], [1, 1, 1]
  )
  assert output.state == ()


def test_width_without_clients_still_gets_its_slice():
  output = _run([_WIDTH_2, _WIDTH_8])
  # Columns 0-1 hold both clients' values; columns 2-3 only the width-8
  # client's (300, 400), since the width-2 upload was padded with zeros.
  np.testing.assert_array_equal(
      output.result[1],
      [[101, 202, 300, 400], [103, 204, 300, 400], [105, 206, 300, 400]],
  )
  np.testing.assert_array_equal(
      output.measurements['clients_per_width'], [1, 0, 1]
  )


def test_clients_of_the_same_width_add_up():
  uploads = [np.full([3, 4], v, np.float32) for v in (1, 2, 3)]
  output = _run(uploads)
  # 1 + 2 + 3 = 6 in the 4 uploaded columns, zero padding beyond.
  np.testing.assert_array_equal(output.result[0], np.full([3, 2], 6))
  np.testing.assert_array_equal(output.result[1], np.full([3, 4], 6))
  np.testing.assert_array_equal(
      output.result[2], np.tile([6, 6, 6, 6, 0, 0, 0, 0], [3, 1])
  )
  np.testing.assert_array_equal(
      output.measurements['clients_per_width'], [0, 3, 0]
  )


def test_upload_of_an_unlisted_width_is_summed_but_not_counted():
  output = _run([np.ones([3, 3], np.float32)])
  np.testing.assert_array_equal(
      output.result[2], np.tile([1, 1, 1, 0, 0, 0, 0, 0], [3, 1])
  )
  np.testing.assert_array_equal(
      output.measurements['clients_per_width'], [0, 0, 0]
  )


def test_slices_the_trailing_dimension_of_a_higher_rank_value():
  value_type = tff.TensorType(np.float32, [2, 1, None])
  output = _run(
      [np.array([[[1]], [[2]]], np.float32), np.ones([2, 1, 3], np.float32)],
      output_widths=(1, 3),
      value_type=value_type,
  )
  # [[[1]], [[2]]] padded to [[[1, 0, 0]], [[2, 0, 0]]], plus ones.
  np.testing.assert_array_equal(output.result[0], [[[2]], [[3]]])
  np.testing.assert_array_equal(output.result[1], [[[2, 1, 1]], [[3, 1, 1]]])


def test_rejects_an_upload_wider_than_the_largest_width():
  with pytest.raises(Exception, match='wider than max'):
    _run([np.ones([3, 9], np.float32)])


@pytest.mark.parametrize(
    'output_widths,message',
    [
        pytest.param((), 'at least one', id='empty'),
        pytest.param((2, 2, 8), 'strictly increasing', id='repeated'),
        pytest.param((8, 4), 'strictly increasing', id='decreasing'),
        pytest.param((0, 4), 'positive', id='zero'),
        pytest.param((2.0, 4), 'positive integers', id='float'),
    ],
)
def test_constructor_rejects_bad_widths(output_widths, message):
  with pytest.raises(ValueError, match=message):
    padded_sum.PaddedSumFactory(output_widths)


@pytest.mark.parametrize(
    'value_type',
    [
        pytest.param(tff.TensorType(np.float32, [3, 8]), id='known_last_dim'),
        pytest.param(tff.TensorType(np.float64, [3, None]), id='float64'),
        pytest.param(tff.TensorType(np.int32, [3, None]), id='int32'),
        pytest.param(
            tff.TensorType(np.float32, [None, None]), id='unknown_rows'
        ),
        pytest.param(tff.TensorType(np.float32), id='scalar'),
        pytest.param(tff.TensorType(np.float32, None), id='unknown_rank'),
        pytest.param(
            tff.StructType([tff.TensorType(np.float32, [3, None])]),
            id='struct',
        ),
    ],
)
def test_create_rejects_a_value_that_is_not_float32_with_open_last_dim(
    value_type,
):
  with pytest.raises(TypeError, match='trailing dimension is None'):
    padded_sum.PaddedSumFactory((2, 4, 8)).create(value_type)
