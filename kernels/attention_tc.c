/* kern_attention_tc_takes (see attention.h): the tensor-core path's rule on
 * shapes, in one place for both backends and the model description. */
#include "kernels/attention.h"

bool kern_attention_tc_takes(int nh, int nkv, int hd) {
    return nkv > 0 && nh > 0 && nh % nkv == 0 && hd > 0 && hd % 8 == 0 && hd <= 256;
}
