# Sourced by the device scripts from the repository root: Debian's libraries
# carried in .devdeps/root (the device image has none of them), and CUDA's tools.
if [ -d .devdeps/root ]; then
    D=$PWD/.devdeps/root
    export CPATH=$D/usr/include${CPATH:+:$CPATH}
    export LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
    export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PATH=/usr/local/cuda/bin:$PATH
