"""Names of the function attributes our passes write and later stages read."""

GROUP = "tvm_ext.group"  # on grouped Relax functions: the group id of the partition
PATTERN = "tvm_ext.pattern"  # on grouped functions and kernels: the group's fuse pattern
LOCAL = "tvm_ext.local"  # on grouped functions: members to realize as kernel-local stages
MASTER = "tvm_ext.master"  # on grouped functions and kernels: "name:op" of the master node
KERNEL = "tvm_ext.kernel"  # on PrimFuncs we generated: the group's pattern name
OPS = "tvm_ext.ops"  # on our PrimFuncs: comma-separated Relax ops the kernel covers
LOOP_IR = "tvm_ext.loop_ir"  # on our PrimFuncs: the kernel's Loop IR, as text
CTX_GROUP = "tvm_ext.ctx_group"  # on Relax functions: binding name -> device group label (NNVM's ctx_group)
GRAD_OF = "tvm_ext.grad_of"  # on adjoint functions: backward binding name -> the forward binding it differentiates
DEVICES = "tvm_ext.devices"  # on placed modules: the device names ("cpu:0", ...) in VDevice order
SCHEDULE = "tvm_ext.schedule"  # on our PrimFuncs: the plan applied to each block
