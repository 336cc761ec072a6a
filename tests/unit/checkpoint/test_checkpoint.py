"""Loading released, dense and own checkpoints; refusing ones that do not fit or are not plain data."""
import argparse
import collections
import functools
import http.server
import importlib
import logging
import os
import subprocess
import sys
import threading
import zipfile

import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmengine.logging import HistoryBuffer, MMLogger
from mmengine.registry import init_default_scope

from mala_mm import MALA
from mala_mm.checkpoint import CheckpointError, CheckpointNotFoundError, extract_backbone_state_dict, safe_load
from tests.helpers import DATA_DIR, OFFICIAL_LAYOUT_DIR, ROOT, load_config
from tests.helpers.hostile_pickles import Calls, LooksUpAMethod, WritesAFile

DET_CKPT = os.path.join(DATA_DIR, 'official_det_ckpt.pth')


def read_layout(name):
    """{key: shape} of one release layout file."""
    layout = {}
    with open(os.path.join(OFFICIAL_LAYOUT_DIR, name)) as f:
        for line in f:
            if not line.startswith('#'):
                key, shape, _ = line.rstrip('\n').split('\t')
                layout[key] = tuple(int(n) for n in shape.strip('()').split(',') if n.strip())
    return layout


def shapes(state_dict):
    return {k: tuple(v.shape) for k, v in state_dict.items()}


def test_state_dict_layout_is_the_releases_dense_layout():
    assert shapes(MALA(arch='tiny').state_dict()) == read_layout('official_det_backbone_tiny.txt')


@pytest.mark.parametrize('arch', ['tiny', 'small', 'base', 'large'])
def test_state_dict_layout_is_the_releases_classification_layout(arch):
    released = read_layout(f'official_cls_{arch}.txt')
    backbone_only = {k: v for k, v in released.items() if not k.startswith(('proj.', 'norm.', 'head.'))}
    ours = {k: v for k, v in shapes(MALA(arch=arch).state_dict()).items() if not k.startswith('extra_norms.')}
    assert ours == backbone_only


def pretrained(model_cls_kwargs, path):
    model = MALA(**model_cls_kwargs, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    return model


def save_release_classification_checkpoint(path, arch) -> dict:
    """A file at ``path`` as the release's ImageNet trainer saves it, of a random MALA of ``arch`` with its
    classification head; returns its weights."""
    source = MALA(arch=arch)
    source.init_weights()
    weights = {k: v for k, v in source.state_dict().items() if not k.startswith('extra_norms.')}
    weights.update({'proj.weight': torch.randn(128, 64, 1, 1), 'norm.weight': torch.ones(128),
                    'head.weight': torch.randn(1000, 128, 1, 1), 'head.bias': torch.zeros(1000)})
    torch.save({'model': weights, 'model_ema': weights, 'optimizer': {'state': {}, 'param_groups': []},
                'lr_scheduler': {'last_epoch': 299}, 'epoch': 299, 'scaler': {'scale': 65536.0},
                'args': argparse.Namespace(model='MALA_T', lr=1e-3, input_size=224, aa='rand-m9-mstd0.5')}, path)
    return weights


def test_loads_release_classification_checkpoint(tmp_path, small_arch):
    path = tmp_path / 'mala_in1k.pth'
    weights = save_release_classification_checkpoint(path, small_arch)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        model = pretrained(dict(arch=small_arch), path)
    finally:
        logger.removeHandler(handler)
    for key, value in weights.items():
        if key in model.state_dict():
            assert torch.equal(model.state_dict()[key], value), key
    assert torch.equal(model.extra_norms['0'].norm.weight, torch.ones(16))  # left at its initialisation
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert any('keys missing' in w and 'extra_norms.0.norm.weight' in w for w in warnings)


def test_loads_dense_checkpoint_under_backbone_prefix():
    model = pretrained(dict(arch=torch.load(os.path.join(DATA_DIR, 'official_det_io.pth'))['arch']), DET_CKPT)
    released = torch.load(DET_CKPT, weights_only=True)['state_dict']
    for key, value in model.state_dict().items():
        assert torch.equal(value, released['backbone.' + key]), key


def test_loads_mmengine_checkpoint_with_message_hub(tmp_path, small_arch):
    source = MALA(arch=small_arch)
    buffer = HistoryBuffer()
    buffer.update(0.5)
    path = tmp_path / 'iter_10.pth'
    torch.save({'meta': {'epoch': 1, 'message_hub': {'log_scalars': {'train/loss': buffer},
                                                     'runtime_info': {'lr': np.float64(1e-4), 'ids': np.arange(3)}}},
                'state_dict': {f'backbone.{k}': v for k, v in source.state_dict().items()},
                'optimizer': {'state': {}, 'param_groups': []},
                # MultiStepLR's state: its milestones are a Counter (not in torch 2.1's own allow-list)
                'param_schedulers': [{'milestones': collections.Counter({8: 1, 11: 1}), 'last_epoch': 1}]}, path)
    model = pretrained(dict(arch=small_arch), path)
    for key, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[key], value)


def test_safety_does_not_depend_on_torchs_safe_globals_api(tmp_path):
    """On a torch without ``torch.serialization.safe_globals`` (before 2.4) or ``add_safe_globals`` (before 2.5),
    mmengine's checkpoints load, in the zip and the legacy format, and a hostile pickle is still refused: the
    restriction is this package's own unpickler, not torch's lists."""
    script = f"""
import os, numpy as np, torch
from mmengine.logging import HistoryBuffer
from tests.helpers.hostile_pickles import Calls
from mala_mm.checkpoint import CheckpointError, safe_load
for name in ('safe_globals', 'add_safe_globals'):  # torch's own modules use them where they exist
    if hasattr(torch.serialization, name):
        delattr(torch.serialization, name)
buffer = HistoryBuffer()
buffer.update(0.5)
checkpoint = {{'meta': {{'message_hub': {{'log_scalars': {{'loss': buffer}}, 'lr': np.float64(1e-4)}}}},
              'state_dict': {{'w': torch.arange(3.)}}}}
for zip_format in (True, False):
    path = os.path.join({str(tmp_path)!r}, f'zip_{{zip_format}}.pth')
    torch.save(checkpoint, path, _use_new_zipfile_serialization=zip_format)
    loaded = safe_load(path)
    assert torch.equal(loaded['state_dict']['w'], torch.arange(3.)), zip_format
    assert loaded['meta']['message_hub']['log_scalars']['loss'].mean() == 0.5, zip_format
    hostile = os.path.join({str(tmp_path)!r}, f'hostile_{{zip_format}}.pth')
    marker = hostile + '.ran'
    torch.save({{'payload': Calls(os.system, (f'touch {{marker}}', ))}}, hostile,
               _use_new_zipfile_serialization=zip_format)
    try:
        safe_load(hostile)
        raise AssertionError(f'{{hostile}} was loaded')
    except CheckpointError as err:
        assert 'refused to load' in str(err) and 'posix.system' in str(err), err
    assert not os.path.exists(marker), zip_format
print('ok')
"""
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120,
                            cwd=ROOT)
    assert result.returncode == 0 and result.stdout == 'ok\n', result.stdout + result.stderr


def test_loads_own_plain_state_dict(tmp_path, small_arch):
    source = MALA(arch=small_arch)
    source.init_weights()
    path = tmp_path / 'backbone.pth'
    torch.save(source.state_dict(), path)
    model = pretrained(dict(arch=small_arch), path)
    x = torch.randn(1, 3, 40, 40)
    for a, b in zip(source.eval()(x), model.eval()(x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def web_folder(tmp_path, monkeypatch):
    """A folder served over HTTP on the loopback address, and its URL; torch's download cache in tmp_path."""
    folder = tmp_path / 'served'
    folder.mkdir()
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    monkeypatch.setenv('NO_PROXY', '127.0.0.1')
    monkeypatch.setenv('no_proxy', '127.0.0.1')
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0),
                                             functools.partial(_QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield folder, f'http://127.0.0.1:{server.server_port}'
    server.shutdown()
    server.server_close()


def backbone_from_config(checkpoint, arch):
    """The backbone of the MALA-T Mask R-CNN config with ``arch``, its init_cfg's checkpoint ``checkpoint``,
    initialised."""
    cfg = load_config(os.path.join(ROOT, 'configs/detection/mask_rcnn_mala_t.py'))
    cfg.model.backbone.arch = arch
    cfg.model.backbone.init_cfg.checkpoint = checkpoint
    init_default_scope(cfg.default_scope)
    backbone = MODELS.build(cfg.model.backbone)
    backbone.init_weights()
    return backbone


def test_a_config_loads_a_release_file_from_a_url_as_from_a_file(web_folder, small_arch):
    """init_cfg's checkpoint as the release's files are published (https://huggingface.co/.../resolve/main/FILE):
    downloaded once into torch's hub cache, then read by the same safe reading as a local file."""
    folder, url = web_folder
    weights = save_release_classification_checkpoint(folder / 'MALA_T.pth', small_arch)
    for attempt in ('downloaded', 'cached'):
        state = backbone_from_config(f'{url}/MALA_T.pth', small_arch).state_dict()
        loaded = [key for key in weights if key in state]
        assert len(loaded) == len(state) - 8, attempt  # all but the 4 output norms' weights and biases
        assert all(torch.equal(state[key], weights[key]) for key in loaded), attempt
        (folder / 'MALA_T.pth').unlink(missing_ok=True)  # the second load cannot download it


def test_a_hostile_or_missing_file_at_a_url_is_refused_as_a_local_one(web_folder, small_arch, tmp_path):
    folder, url = web_folder
    marker = tmp_path / 'pwned'
    torch.save({'model': {}, 'payload': Calls(os.system, (f'touch {marker}', ))}, folder / 'hostile.pth')
    with pytest.raises(CheckpointError) as raised:
        backbone_from_config(f'{url}/hostile.pth', small_arch)
    assert str(raised.value).startswith(f"refused to load '{url}/hostile.pth': its pickle calls posix.system")
    assert not marker.exists()
    with pytest.raises(CheckpointNotFoundError, match=f"'{url}/absent.pth' could not be downloaded: HTTP Error 404"):
        backbone_from_config(f'{url}/absent.pth', small_arch)


def test_wrong_arch_is_a_clear_error():
    with pytest.raises(CheckpointError, match='does not fit this MALA arch.*shapes differ'):
        pretrained(dict(arch='tiny'), DET_CKPT)


def test_checkpoint_of_something_else_is_a_clear_error(tmp_path, small_arch):
    path = tmp_path / 'resnet.pth'
    torch.save({'state_dict': {'conv1.weight': torch.zeros(64, 3, 7, 7)}}, path)
    with pytest.raises(CheckpointError, match='no key'):
        pretrained(dict(arch=small_arch), path)


def test_missing_and_truncated_files_are_clear_errors(tmp_path, small_arch):
    with pytest.raises(FileNotFoundError, match='does not exist'):
        pretrained(dict(arch=small_arch), tmp_path / 'nowhere.pth')
    truncated = tmp_path / 'truncated.pth'
    truncated.write_bytes(open(DET_CKPT, 'rb').read()[:100_000])
    with pytest.raises(CheckpointError, match='truncated'):
        safe_load(str(truncated))
    junk = tmp_path / 'notes.pth'
    junk.write_bytes(b'these are not weights\n' * 10)
    with pytest.raises(CheckpointError, match='not a PyTorch checkpoint'):
        safe_load(str(junk))


@pytest.mark.parametrize('payload', ['open', 'getattr'])
def test_a_pickle_that_runs_code_is_refused_without_running(tmp_path, payload):
    marker = tmp_path / 'pwned'
    path = tmp_path / 'hostile.pth'
    hostile = WritesAFile(str(marker)) if payload == 'open' else LooksUpAMethod()
    torch.save({'state_dict': {}, 'payload': hostile}, path)
    with pytest.raises(CheckpointError, match=f'refused to load .*{payload}'):
        safe_load(str(path))
    assert not marker.exists()


def _touch(marker):
    return ['touch', str(marker)]


def _object_array(payload):
    array = np.empty(1, dtype=object)
    array[0] = payload
    return array


# each: (payload from a marker path, the global's name that must appear in the message)
HOSTILE = {
    'os.system': (lambda m: Calls(os.system, (f'touch {m}', )), 'posix.system (os.system)'),
    'subprocess.Popen': (lambda m: Calls(subprocess.Popen, (_touch(m), )), 'subprocess.Popen'),
    'builtins.eval': (lambda m: Calls(eval, (f'open({str(m)!r}, "w")', )), 'builtins.eval'),
    'builtins.exec': (lambda m: Calls(exec, (f'open({str(m)!r}, "w")', )), 'builtins.exec'),
    'importlib.import_module': (lambda m: Calls(importlib.import_module, ('os', )), 'importlib.import_module'),
    # argparse.Namespace is allowed (the release's `args`); its state hides the call
    'allowed class, hostile state': (
        lambda m: Calls(argparse.Namespace, (), {'x': Calls(os.system, (f'touch {m}', ))}), 'posix.system'),
    'numpy object array': (lambda m: _object_array(Calls(os.system, (f'touch {m}', ))), 'posix.system'),
}


@pytest.mark.parametrize('case', list(HOSTILE))
def test_each_hostile_global_is_refused_by_name_without_running(tmp_path, case):
    make_payload, name = HOSTILE[case]
    marker = tmp_path / 'pwned'
    path = tmp_path / 'hostile.pth'
    torch.save({'state_dict': {'w': torch.ones(2)}, 'payload': make_payload(marker)}, path)
    with pytest.raises(CheckpointError) as raised:
        safe_load(str(path))
    message = str(raised.value)
    assert message.startswith(f"refused to load '{path}': its pickle calls ") and name in message
    assert 'nothing of it was run' in message and 'do not load it with weights_only=False' in message
    assert not marker.exists()


def _zip_without_pickle(path):
    with zipfile.ZipFile(path, 'w') as archive:
        archive.writestr('weights/readme.txt', 'soon')


@pytest.mark.parametrize('case,write,message', [
    ('truncated', lambda p: p.write_bytes(open(DET_CKPT, 'rb').read()[:100_000]),
     'it is truncated or corrupted (100000 bytes; its zip archive has no end); download or copy it again'),
    ('zip, not a checkpoint', _zip_without_pickle,
     "it is a zip archive but not a PyTorch checkpoint (no data.pkl among ['weights/readme.txt'])"),
    ('empty', lambda p: p.write_bytes(b''), 'the file is empty (0 bytes); download or copy it again'),
    ('text', lambda p: p.write_text('<html><body>404 Not Found</body></html>\n'),
     "it is a text file, not a PyTorch checkpoint (it begins '<html><body>404 Not Found</body></html>'); a failed "
     'download often saves an error page'),
])
def test_each_kind_of_unreadable_file_has_its_own_message(tmp_path, case, write, message):
    path = tmp_path / 'model.pth'
    write(path)
    with pytest.raises(CheckpointError) as raised:
        safe_load(str(path))
    assert str(raised.value) == f"cannot read checkpoint '{path}': {message}"


def test_extract_drops_classification_head_and_ddp_prefix():
    state = extract_backbone_state_dict(
        {'model': {'module.layers.0.RoPE.angle': torch.zeros(2), 'module.head.weight': torch.zeros(1)}})
    assert list(state) == ['layers.0.RoPE.angle']


LOADING_STATE = """
import sys, torch
from mmengine.runner import CheckpointLoader
registered = []  # the prefixes of the loaders registered through mmengine's one way to register one
register = CheckpointLoader.register_scheme
def recorded(prefixes, loader=None, force=False):
    registered.append(prefixes)
    return register(prefixes, loader, force)
CheckpointLoader.register_scheme = staticmethod(recorded)
def outcome():
    try:
        return 'loaded ' + str(sorted(CheckpointLoader.load_checkpoint(sys.argv[1], map_location='cpu')))
    except Exception as err:
        return f'{type(err).__name__}: {str(err)[:300]}'
def state():
    return list(registered), list(getattr(torch.serialization, 'get_safe_globals', list)())
before, loaded_before = state(), outcome()
for module in sys.argv[2:]:
    __import__(module)
print(state() == before, outcome() == loaded_before, outcome().split(' ')[0])
"""


@pytest.mark.parametrize('imports, expected', [
    (['mala_mm'], 'True True'),  # nothing changed: the checkpoint loads, or fails, as without this package
    (['mala_mm', 'mala_mm.safe_loading'], 'False'),  # the switch: mmengine's loader is safe_load
])
def test_a_bare_import_leaves_checkpoint_loading_as_it_was(tmp_path, imports, expected):
    """``import mala_mm`` changes neither mmengine's checkpoint loaders nor torch's safe globals, and an
    unrelated checkpoint with numpy in its meta loads through mmengine exactly as it did before the import;
    ``import mala_mm.safe_loading`` is the one switch, after which mmengine reads it through safe_load."""
    path = tmp_path / 'other.pth'
    torch.save({'state_dict': {'w': torch.ones(1)}, 'meta': {'ids': np.arange(3)}}, path)
    result = subprocess.run([sys.executable, '-c', LOADING_STATE, str(path), *imports], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = result.stdout.strip().splitlines()[-1]
    assert printed.startswith(expected), printed
    if len(imports) > 1:
        assert printed.endswith(' loaded'), printed  # where torch >= 2.6's weights_only refused the numpy array


@pytest.mark.slow
def test_mmdets_own_train_py_resumes_a_config_here(builtin_workspace, tmp_path):
    """mmdet's own tools/train.py (the one pip installs) resumes a config here: the config's custom_imports ask
    for mala_mm.safe_loading, without which torch >= 2.6 refuses mmengine's checkpoint (numpy and HistoryBuffer in
    its meta)."""
    import mmdet

    from tests.helpers import ROOT, tool_env
    train = [sys.executable, os.path.join(os.path.dirname(mmdet.__file__), '.mim/tools/train.py'),
             os.path.join(ROOT, 'configs/detection/mask_rcnn_mala_t_builtin.py'), '--work-dir', str(tmp_path)]
    for iters, resume in ((2, []), (4, ['--resume'])):
        result = subprocess.run([*train, *resume, '--cfg-options', f'train_cfg.max_iters={iters}', 'val_cfg=None',
                                 'val_dataloader=None', 'val_evaluator=None'],
                                cwd=builtin_workspace, env=tool_env(), capture_output=True, text=True, timeout=900)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-3000:]
    assert 'Load checkpoint from' in output and 'resumed epoch: 0, iter: 2' in output, output[-3000:]
    assert (tmp_path / 'iter_4.pth').is_file()
