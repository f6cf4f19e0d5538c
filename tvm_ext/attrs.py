"""Names of the function attributes our passes write and later stages read."""

GROUP = "tvm_ext.group"  # on grouped Relax functions: the group id of the partition
PATTERN = "tvm_ext.pattern"  # on grouped functions and kernels: the group's fuse pattern
LOCAL = "tvm_ext.local"  # on grouped functions: members to realize as kernel-local stages
MASTER = "tvm_ext.master"  # on grouped functions and kernels: "name:op" of the master node (for people)
TILED_EPILOGUE = "tvm_ext.tiled_epilogue"  # on grouped functions and kernels: the epilogue runs on the
# master op's output tiles (its pattern is OutEWiseFusable), so schedules keep the stages together
KERNEL = "tvm_ext.kernel"  # on PrimFuncs we generated: the group's pattern name
OPS = "tvm_ext.ops"  # on our PrimFuncs: comma-separated Relax ops the kernel covers
LOOP_IR = "tvm_ext.loop_ir"  # on our PrimFuncs: the kernel's Loop IR, as text
CTX_GROUP = "tvm_ext.ctx_group"  # on Relax functions: binding name -> device group label (NNVM's ctx_group)
GRAD_OF = "tvm_ext.grad_of"  # on adjoint functions: backward binding name -> the forward binding it differentiates
DEVICES = "tvm_ext.devices"  # on placed modules: the device names ("cpu:0", ...) in VDevice order
SCHEDULE = "tvm_ext.schedule"  # on our PrimFuncs: the plan applied to each block
SCOPES = "tvm_ext.scopes"  # on Relax functions: binding name -> {scope attribute: value} (AutoFuse's scopes)
CONTROL_DEPS = "tvm_ext.control_deps"  # on Relax functions: binding name -> bindings it must run after (NNVM)
CORES = "tvm_ext.cores"  # on grouped functions and kernels: the most cores the kernel may run on
SHAPE_ONLY = "tvm_ext.shape_only"  # on our PrimFuncs: indices of the inputs only read for their shape
#   (every use an ``OpDef.shape_only`` argument: NNVM's FIgnoreInputs), for PlanMemory

# Scope attributes (set with ``sym.AttrScope``, or in SCOPES for Relax models) that AutoFuse reads:
DISABLE_AUTOFUSE_SCOPE = "_disable_autofuse_scope"  # seed rule 11: the op skips lowering
SUPER_KERNEL_SCOPE = "_super_kernel_scope"  # seed rule 10: the op is skipped by AutoFuse
CORE_SCOPE = "_core_scope"  # seed rule 8: the number of cores the op's kernel may use
SCOPE_KEYS = (DISABLE_AUTOFUSE_SCOPE, SUPER_KERNEL_SCOPE, CORE_SCOPE)
