"""ctypes mirrors of host_api/protrain.h (ABI v1).

Every struct here has the same field order and types as the C header; the test
test_layout.py compiles a C program that prints each struct's size and field
offsets and compares them with these classes, so the two cannot drift.
"""
import ctypes as C

ABI_VERSION = 1
ABI_MIN_VERSION = 1
PLUGIN_SYMBOL = "protrain_plugin_v1"

# pt_status: stable codes, never renumbered.
STATUS_NAMES = {
    0: "PT_OK",
    1: "PT_ERR_INVALID_ARG",
    2: "PT_ERR_CONFIG",
    3: "PT_ERR_OOM",
    4: "PT_ERR_HOST_OOM",
    5: "PT_ERR_ORDER",
    6: "PT_ERR_BACKEND",
    7: "PT_ERR_IO",
    8: "PT_ERR_UNSUPPORTED",
    9: "PT_ERR_INTERNAL",
    10: "PT_ERR_CALLBACK",
    11: "PT_ERR_FORMAT",
    12: "PT_ERR_INFEASIBLE",
}
for _code, _name in STATUS_NAMES.items():
    globals()[_name] = _code

PT_F32, PT_BF16, PT_F16, PT_U8 = 0, 1, 2, 3
PT_LOG_ERROR, PT_LOG_WARN, PT_LOG_INFO, PT_LOG_DEBUG, PT_LOG_TRACE = 0, 1, 2, 3, 4
PT_DEVICE_AUTO, PT_DEVICE_HOST, PT_DEVICE_CUDA = 0, 1, 2
PT_COPY_H2D, PT_COPY_D2H, PT_COPY_D2D = 0, 1, 2
PT_OPTIM_FROM_CONFIG, PT_OPTIM_ADAMW, PT_OPTIM_REKLS = 0, 1, 2
PT_HOST_ASYNC_COMPUTE = 1 << 0

i32, u32, i64, u64 = C.c_int32, C.c_uint32, C.c_int64, C.c_uint64
vp = C.c_void_p

LOG_FN = C.CFUNCTYPE(None, vp, i32, C.c_char_p)
BLOCK_CB = C.CFUNCTYPE(i32, vp, i32)
USER_CB = C.CFUNCTYPE(i32, vp)
TILE_CB = C.CFUNCTYPE(i32, vp, i32, i64, i64)
LAUNCH_FN = C.CFUNCTYPE(None, vp)
# pt_host_coll_v1's ops: (user, send, recv, bytes, err, errlen) and (user, err, errlen)
COLL_XFER = C.CFUNCTYPE(i32, vp, vp, vp, u64, vp, u64)
COLL_BARRIER = C.CFUNCTYPE(i32, vp, vp, u64)


class pt_host_coll_v1(C.Structure):
    _fields_ = [
        ("struct_size", u32),
        ("rank", i32),
        ("world_size", i32),
        ("reserved0", i32),
        ("user", vp),
        ("all_gather", COLL_XFER),
        ("all_to_all", COLL_XFER),
        ("barrier", COLL_BARRIER),
        ("reserved", vp * 4),
    ]


class pt_host_v1(C.Structure):
    _fields_ = [
        ("abi_version", u32),
        ("struct_size", u32),
        ("rank", i32),
        ("world_size", i32),
        ("local_rank", i32),
        ("device_kind", i32),
        ("device_index", i32),
        ("flags", u32),
        ("compute_stream", vp),
        ("user", vp),
        ("log", LOG_FN),
        ("recompute_block", BLOCK_CB),
        ("profile_step", USER_CB),
        ("mlp_forward", TILE_CB),
        ("mlp_backward", TILE_CB),
        ("fingerprint", C.c_char_p),
        ("coll", C.POINTER(pt_host_coll_v1)),
        ("reserved", vp * 6),
    ]


class pt_param_v1(C.Structure):
    _fields_ = [
        ("name", C.c_char_p),
        ("dtype", i32),
        ("ndim", i32),
        ("shape", i64 * 4),
        ("block", i32),
        ("trainable", i32),
        ("tie", i32),
        ("tp_split", i32),
        ("init", vp),
        ("data", vp),
        ("grad", vp),
        ("reserved", vp * 2),
    ]


class pt_model_v1(C.Structure):
    _fields_ = [
        ("struct_size", u32),
        ("n_params", i32),
        ("params", C.POINTER(pt_param_v1)),
        ("n_blocks", i32),
        ("reserved0", i32),
        ("batch", i64),
        ("seq", i64),
        ("arch", C.c_char_p),
        ("reserved", vp * 4),
    ]


class pt_optim_v1(C.Structure):
    _fields_ = [
        ("struct_size", u32),
        ("type", i32),
        ("lr", C.c_float),
        ("beta1", C.c_float),
        ("beta2", C.c_float),
        ("eps", C.c_float),
        ("weight_decay", C.c_float),
        ("max_grad_norm", C.c_float),
        ("reserved", i32 * 8),
    ]


class pt_stats_v1(C.Structure):
    _fields_ = [
        ("struct_size", u32),
        ("reserved0", i32),
        ("dev_capacity", u64),
        ("dev_current", u64),
        ("dev_peak", u64),
        ("pinned_current", u64),
        ("h2d_bytes", u64),
        ("d2h_bytes", u64),
        ("last_grad_norm", C.c_double),
        ("steps", i64),
        ("n_persist", i32),
        ("n_buffer", i32),
        ("n_swap", i32),
        ("n_checkpoint", i32),
        ("n_chunk", i32),
        ("mode", i32),
        ("cpu_optim_s", C.c_double),
        ("optim_wait_s", C.c_double),
        ("recomputes", i64),
        ("swap_bytes", u64),
        ("pred_peak", u64),
        ("pred_iter_s", C.c_double),
        ("pinned_arena", u64),
        ("pinned_own_allocs", u64),
        ("cpu_optim_hidden_s", C.c_double),
        ("mlp_tiles", u64),
        ("osft_targets", u64),
        # ABI 1.7 (0 from older plugins): pinned high-water mark, the disk
        # tier's I/O-thread and exposed wait microseconds
        ("pinned_peak", u64),
        ("tier_io_us", u64),
        ("tier_wait_us", u64),
    ]


PP = C.POINTER(vp)
_table_hooks = [
    ("init", C.CFUNCTYPE(i32, C.c_char_p, C.POINTER(pt_host_v1), PP)),
    ("last_error", C.CFUNCTYPE(C.c_char_p, vp)),
    ("post_model_load", C.CFUNCTYPE(i32, vp, C.POINTER(pt_model_v1))),
    ("create_optimizer", C.CFUNCTYPE(i32, vp, C.POINTER(pt_optim_v1))),
    ("pre_step", C.CFUNCTYPE(i32, vp, i64, i32, i32)),
    ("block_pre_forward", C.CFUNCTYPE(i32, vp, i32)),
    ("block_post_forward", C.CFUNCTYPE(i32, vp, i32)),
    ("block_pre_backward", C.CFUNCTYPE(i32, vp, i32)),
    ("block_post_backward", C.CFUNCTYPE(i32, vp, i32)),
    ("optimizer_step", C.CFUNCTYPE(i32, vp, C.c_float)),
    ("post_step", C.CFUNCTYPE(i32, vp, i64, C.c_float)),
    ("finalize", C.CFUNCTYPE(i32, vp)),
    ("dev_alloc", C.CFUNCTYPE(i32, vp, u64, C.c_char_p, PP)),
    ("dev_free", C.CFUNCTYPE(i32, vp, vp)),
    ("activation_arena", C.CFUNCTYPE(i32, vp, i32, u64, PP)),
    ("activation_arena_get", C.CFUNCTYPE(i32, vp, i32, PP)),
    ("memcpy", C.CFUNCTYPE(i32, vp, vp, vp, u64, i32)),
    ("get_stats", C.CFUNCTYPE(i32, vp, C.POINTER(pt_stats_v1))),
    ("read_param", C.CFUNCTYPE(i32, vp, i32, vp, u64)),
    ("save_state", C.CFUNCTYPE(i32, vp, C.c_char_p)),
    ("load_state", C.CFUNCTYPE(i32, vp, C.c_char_p)),
    ("osft_linear_forward", C.CFUNCTYPE(i32, vp, i32, vp, vp, i64)),
    ("osft_linear_backward", C.CFUNCTYPE(i32, vp, i32, vp, vp, vp, i64)),
    ("tiled_mlp_forward", C.CFUNCTYPE(i32, vp, i32, i64)),
    ("tiled_mlp_backward", C.CFUNCTYPE(i32, vp, i32, i64)),
    ("set_lr", C.CFUNCTYPE(i32, vp, C.c_float)),
    ("launch", C.CFUNCTYPE(i32, vp, LAUNCH_FN, vp)),
    ("stream_sync", C.CFUNCTYPE(i32, vp)),
    ("tiled_mlp_scratch", C.CFUNCTYPE(i32, vp, u64, PP)),
    ("dist_allreduce", C.CFUNCTYPE(i32, vp, C.POINTER(C.c_double), i32)),
    # ABI 1.6, the former reserved[0]
    ("clip_grad_norm", C.CFUNCTYPE(i32, vp, C.c_float, C.POINTER(C.c_double))),
    ("discard_step", C.CFUNCTYPE(i32, vp)),         # ABI 1.6, the former reserved[1]
    ("replan", C.CFUNCTYPE(i32, vp, i64, i64)),     # ABI 1.6, the former reserved[2]
]


class pt_plugin_v1(C.Structure):
    _fields_ = [
        ("abi_version", u32),
        ("struct_size", u32),
        ("name", C.c_char_p),
        ("version", C.c_char_p),
    ] + _table_hooks + [
                        # ABI 1.6 (the former reserved[3]; NULL in older plugins)
                        ("dist_abort", C.CFUNCTYPE(i32, vp, C.c_char_p)),
                        # ABI 1.6, appended after the former reserved slots
                        ("write_param", C.CFUNCTYPE(i32, vp, i32, vp, u64))]


# The mandatory core of a v1 table: every field through finalize (as loader.c).
V1_CORE_BYTES = pt_plugin_v1.finalize.offset + C.sizeof(vp)

# Structs the layout test checks against the C header.
MIRRORED = [pt_host_coll_v1, pt_host_v1, pt_param_v1, pt_model_v1, pt_optim_v1, pt_stats_v1, pt_plugin_v1]
