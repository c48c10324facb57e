"""Only what pyproject.toml cannot say: install the start-up hook ``uvmprefetch-startup.pth`` into site-packages
(and, in a wheel, the native sources under ``kernels/`` as ``uvmprefetch/_kernels/``).

Python runs ``import`` lines of ``*.pth`` files in site-packages at start-up; ours costs one environment lookup
when ``UVMPREFETCH`` is unset and enables the runtime when it is set (``uvmprefetch/runtime/startup.py``).
A wheel's root lands in site-packages: for a normal build that is ``build_lib``; for an editable install
(PEP 660) it is the unpacked editable wheel, which setuptools hands to ``install`` as ``install_lib``.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = os.path.join("uvmprefetch", "runtime", "uvmprefetch-startup.pth")


class build_py_with_startup_hook(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
            # a wheel has no kernels/ folder: ship the native sources inside the package (runtime/native.py
            # looks for uvmprefetch/_kernels/ when ../kernels/ is absent) so that the shim and the C++ observer
            # can be built on first use
            self.mkpath(os.path.join(target, "uvmprefetch", "_kernels"))
            for name in sorted(os.listdir("kernels")):
                if name == "Makefile" or name.endswith((".c", ".cpp", ".h")):
                    self.copy_file(os.path.join("kernels", name),
                                   os.path.join(target, "uvmprefetch", "_kernels", name), preserve_mode=0)
        self.copy_file(PTH, os.path.join(target, os.path.basename(PTH)), preserve_mode=0)


setup(cmdclass={"build_py": build_py_with_startup_hook})
