#include "pto/pto-inst.hpp"
using namespace pto;

template <typename Tensor>
static AICORE inline auto PTOAS__GLOBAL_TENSOR_DATA(Tensor &tensor)
    -> decltype(tensor.data()) {
  return tensor.data();
}


enum class PTOAutoSyncTailMode : int {
  kBarrierAll = 0,
  kSetWaitMte3ToSEvent0 = 1,
};

static AICORE inline void ptoas_auto_sync_tail(
    PTOAutoSyncTailMode mode = PTOAutoSyncTailMode::kBarrierAll) {
  switch (mode) {
  case PTOAutoSyncTailMode::kSetWaitMte3ToSEvent0:
    set_flag(PIPE_MTE3, PIPE_S, EVENT_ID0);
    wait_flag(PIPE_MTE3, PIPE_S, EVENT_ID0);
    break;
  case PTOAutoSyncTailMode::kBarrierAll:
  default:
    pipe_barrier(PIPE_ALL);
    break;
  }
}

template <typename Ptr>
static AICORE inline void PTOAS__DCCI_SINGLE_CACHE_LINE(Ptr ptr) {
  dcci((__gm__ void*)ptr, cache_line_t::SINGLE_CACHE_LINE);
}

AICORE void hc_post(__gm__ float* v1, __gm__ float* v2, __gm__ bfloat16_t* v3, __gm__ float* v4, __gm__ float* v5, int64_t v6, int64_t v7, int32_t v8, int32_t v9) {
  const int64_t v10 = 21504;
  const int64_t v11 = 14336;
  SaturationMode v12 = SaturationMode::OFF;
  RoundMode v13 = RoundMode::CAST_ROUND;
  const int64_t v14 = 12;
  const int64_t v15 = 8;
  const int64_t v16 = 2;
  const int64_t v17 = 16;
  const int64_t v18 = 7168;
  const int64_t v19 = 4;
  const int64_t v20 = 1;
  const int64_t v21 = 57344;
  const int64_t v22 = 28672;
  const int64_t v23 = 0;
  const int64_t v24 = 100352;
  const int64_t v25 = 86016;
  const int64_t v26 = 129024;
  using T = float;

  #if defined(__DAV_VEC__)
  set_mask_norm();
  set_vector_mask(-1, -1);
  // pto: %block_inline10__ssa_v0
  int64_t v27 = (int64_t) v8;
  // pto: %41
  int64_t v28 = v27 % v19;
  // pto: %40, %42
  int64_t v29 = (int64_t) ((uint64_t) (v27 / v19) * (uint64_t) v19);
  // pto: %43
  int64_t v30 = (int64_t) ((uint64_t) v29 + (uint64_t) v19);
  set_flag(PIPE_V, PIPE_MTE2, EVENT_ID0);
  set_flag(PIPE_MTE3, PIPE_V, EVENT_ID0);
  for (int64_t i31 = v29; i31 < v30; i31 += v16) {
    // pto: %flat_offset_mul, %flat_offset, %post_w_inline9__tile
    float v32 = (v2)[(int64_t) ((uint64_t) ((int64_t) ((uint64_t) i31 * (uint64_t) v19)) + (uint64_t) v28)];
    // pto: %45
    int64_t v33 = (int64_t) ((uint64_t) i31 + (uint64_t) v20);
    // pto: %46, %47, %44
    float v34 = (v2)[(int64_t) ((uint64_t) ((int64_t) ((uint64_t) v33 * (uint64_t) v19)) + (uint64_t) v28)];
    // pto: %t__tile
    Tile<TileType::Vec, bfloat16_t, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v35 = Tile<TileType::Vec, bfloat16_t, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %t__tile
    uint64_t v36 = (uint64_t) v26;
    TASSIGN(v35, v36);
    // pto: %48
    int64_t v37 = i31 < v23 ? v23 : i31;
    // pto: %x__ssa_v0_pview
    pto::Shape<1, 1, 1, 1, 7168> v38 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %x__ssa_v0_pview
    pto::Stride<7168, 7168, 7168, 7168, 1> v39 = pto::Stride<7168, 7168, 7168, 7168, 1>();
    // pto: %x__ssa_v0_pview
    GlobalTensor<bfloat16_t, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<7168, 7168, 7168, 7168, 1>, pto::Layout::ND> v40 = GlobalTensor<bfloat16_t, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<7168, 7168, 7168, 7168, 1>, pto::Layout::ND>(v3 + (v23 + v37 * v18), v38, v39);
    wait_flag(PIPE_V, PIPE_MTE2, EVENT_ID0);
    TLOAD(v35, v40);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID0);
    // pto: %0
    Tile<TileType::Vec, bfloat16_t, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v41 = Tile<TileType::Vec, bfloat16_t, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %0
    uint64_t v42 = (uint64_t) v25;
    TASSIGN(v41, v42);
    // pto: %50
    int64_t v43 = v33 < v23 ? v23 : v33;
    // pto: %51
    pto::Shape<1, 1, 1, 1, 7168> v44 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %51
    pto::Stride<7168, 7168, 7168, 7168, 1> v45 = pto::Stride<7168, 7168, 7168, 7168, 1>();
    // pto: %51
    GlobalTensor<bfloat16_t, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<7168, 7168, 7168, 7168, 1>, pto::Layout::ND> v46 = GlobalTensor<bfloat16_t, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<7168, 7168, 7168, 7168, 1>, pto::Layout::ND>(v3 + (v23 + v43 * v18), v44, v45);
    TLOAD(v41, v46);
    // pto: %x_row_inline3__tile
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v47 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %x_row_inline3__tile
    uint64_t v48 = (uint64_t) v24;
    TASSIGN(v47, v48);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID0);
    wait_flag(PIPE_MTE3, PIPE_V, EVENT_ID0);
    TCVT(v47, v35, v13, v12);
    set_flag(PIPE_V, PIPE_MTE2, EVENT_ID1);
    // pto: %y_row_inline15__tile
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v49 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %y_row_inline15__tile
    uint64_t v50 = (uint64_t) v24;
    TASSIGN(v49, v50);
    TMULS(v49, v47, v32);
    // pto: %52
    int64_t v51 = (int64_t) ((uint64_t) i31 * (uint64_t) v17);
    // pto: %53, %comb_w_inline12__tile
    float v52 = (v4)[(int64_t) ((uint64_t) v51 + (uint64_t) v28)];
    // pto: %55
    int64_t v53 = (int64_t) ((uint64_t) v28 + (uint64_t) v19);
    // pto: %57, %54
    float v54 = (v4)[(int64_t) ((uint64_t) v51 + (uint64_t) v53)];
    // pto: %59
    int64_t v55 = (int64_t) ((uint64_t) v28 + (uint64_t) v15);
    // pto: %61, %58
    float v56 = (v4)[(int64_t) ((uint64_t) v51 + (uint64_t) v55)];
    // pto: %63
    int64_t v57 = (int64_t) ((uint64_t) v28 + (uint64_t) v14);
    // pto: %65, %62
    float v58 = (v4)[(int64_t) ((uint64_t) v51 + (uint64_t) v57)];
    // pto: %res_row_inline8__tile
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v59 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %res_row_inline8__tile
    uint64_t v60 = (uint64_t) v26;
    TASSIGN(v59, v60);
    // pto: %residual_flat_inline4__ssa_v0_pview
    pto::Shape<1, 1, 1, 1, 7168> v61 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %residual_flat_inline4__ssa_v0_pview
    pto::Stride<28672, 28672, 28672, 28672, 1> v62 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %residual_flat_inline4__ssa_v0_pview
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v63 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v5 + (v23 + v37 * v22), v61, v62);
    wait_flag(PIPE_V, PIPE_MTE2, EVENT_ID1);
    TLOAD(v59, v63);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID1);
    // pto: %1
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v64 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %1
    uint64_t v65 = (uint64_t) v23;
    TASSIGN(v64, v65);
    // pto: %70
    pto::Shape<1, 1, 1, 1, 7168> v66 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %70
    pto::Stride<28672, 28672, 28672, 28672, 1> v67 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %70
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v68 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v5 + (v18 + v37 * v22), v66, v67);
    TLOAD(v64, v68);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID2);
    // pto: %2
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v69 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %2
    uint64_t v70 = (uint64_t) v22;
    TASSIGN(v69, v70);
    // pto: %73
    pto::Shape<1, 1, 1, 1, 7168> v71 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %73
    pto::Stride<28672, 28672, 28672, 28672, 1> v72 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %73
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v73 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v5 + (v11 + v37 * v22), v71, v72);
    TLOAD(v69, v73);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID3);
    // pto: %3
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v74 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %3
    uint64_t v75 = (uint64_t) v21;
    TASSIGN(v74, v75);
    // pto: %76
    pto::Shape<1, 1, 1, 1, 7168> v76 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %76
    pto::Stride<28672, 28672, 28672, 28672, 1> v77 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %76
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v78 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v5 + (v10 + v37 * v22), v76, v77);
    TLOAD(v74, v78);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID4);
    // pto: %weighted_inline11__tile
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v79 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %weighted_inline11__tile
    uint64_t v80 = (uint64_t) v26;
    TASSIGN(v79, v80);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID1);
    TMULS(v79, v59, v52);
    // pto: %4
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v81 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %4
    uint64_t v82 = (uint64_t) v26;
    TASSIGN(v81, v82);
    TADD(v81, v49, v79);
    // pto: %5
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v83 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %5
    uint64_t v84 = (uint64_t) v23;
    TASSIGN(v83, v84);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID2);
    TMULS(v83, v64, v54);
    // pto: %6
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v85 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %6
    uint64_t v86 = (uint64_t) v26;
    TASSIGN(v85, v86);
    TADD(v85, v81, v83);
    // pto: %7
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v87 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %7
    uint64_t v88 = (uint64_t) v23;
    TASSIGN(v87, v88);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID3);
    TMULS(v87, v69, v56);
    // pto: %8
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v89 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %8
    uint64_t v90 = (uint64_t) v26;
    TASSIGN(v89, v90);
    TADD(v89, v85, v87);
    // pto: %9
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v91 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %9
    uint64_t v92 = (uint64_t) v23;
    TASSIGN(v91, v92);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID4);
    TMULS(v91, v74, v58);
    // pto: %10
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v93 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %10
    uint64_t v94 = (uint64_t) v24;
    TASSIGN(v93, v94);
    TADD(v93, v89, v91);
    set_flag(PIPE_V, PIPE_MTE2, EVENT_ID2);
    set_flag(PIPE_V, PIPE_MTE3, EVENT_ID0);
    // pto: %78
    int64_t v95 = (int64_t) ((uint64_t) v28 * (uint64_t) v18);
    // pto: %79
    int64_t v96 = v95 < v23 ? v23 : v95;
    // pto: %y_flat_inline7__iter_v1_pview
    pto::Shape<1, 1, 1, 1, 7168> v97 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %y_flat_inline7__iter_v1_pview
    pto::Stride<28672, 28672, 28672, 28672, 1> v98 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %y_flat_inline7__iter_v1_pview
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v99 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v1 + ((v23 + v37 * v22) + v96), v97, v98);
    wait_flag(PIPE_V, PIPE_MTE3, EVENT_ID0);
    TSTORE(v99, v93);
    set_flag(PIPE_MTE3, PIPE_V, EVENT_ID1);
    // pto: %11
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v100 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %11
    uint64_t v101 = (uint64_t) v24;
    TASSIGN(v100, v101);
    wait_flag(PIPE_MTE3, PIPE_V, EVENT_ID1);
    TCVT(v100, v41, v13, v12);
    // pto: %12
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v102 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %12
    uint64_t v103 = (uint64_t) v24;
    TASSIGN(v102, v103);
    TMULS(v102, v100, v34);
    // pto: %82
    int64_t v104 = (int64_t) ((uint64_t) v33 * (uint64_t) v17);
    // pto: %83, %80
    float v105 = (v4)[(int64_t) ((uint64_t) v104 + (uint64_t) v28)];
    // pto: %88, %84
    float v106 = (v4)[(int64_t) ((uint64_t) v104 + (uint64_t) v53)];
    // pto: %93, %89
    float v107 = (v4)[(int64_t) ((uint64_t) v104 + (uint64_t) v55)];
    // pto: %98, %94
    float v108 = (v4)[(int64_t) ((uint64_t) v104 + (uint64_t) v57)];
    // pto: %13
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v109 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %13
    uint64_t v110 = (uint64_t) v26;
    TASSIGN(v109, v110);
    // pto: %102
    pto::Shape<1, 1, 1, 1, 7168> v111 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %102
    pto::Stride<28672, 28672, 28672, 28672, 1> v112 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %102
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v113 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v5 + (v23 + v43 * v22), v111, v112);
    wait_flag(PIPE_V, PIPE_MTE2, EVENT_ID2);
    TLOAD(v109, v113);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID5);
    // pto: %14
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v114 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %14
    uint64_t v115 = (uint64_t) v23;
    TASSIGN(v114, v115);
    // pto: %106
    pto::Shape<1, 1, 1, 1, 7168> v116 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %106
    pto::Stride<28672, 28672, 28672, 28672, 1> v117 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %106
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v118 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v5 + (v18 + v43 * v22), v116, v117);
    TLOAD(v114, v118);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID6);
    // pto: %15
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v119 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %15
    uint64_t v120 = (uint64_t) v22;
    TASSIGN(v119, v120);
    // pto: %110
    pto::Shape<1, 1, 1, 1, 7168> v121 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %110
    pto::Stride<28672, 28672, 28672, 28672, 1> v122 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %110
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v123 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v5 + (v11 + v43 * v22), v121, v122);
    TLOAD(v119, v123);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID7);
    // pto: %16
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v124 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %16
    uint64_t v125 = (uint64_t) v21;
    TASSIGN(v124, v125);
    // pto: %114
    pto::Shape<1, 1, 1, 1, 7168> v126 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %114
    pto::Stride<28672, 28672, 28672, 28672, 1> v127 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %114
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v128 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v5 + (v10 + v43 * v22), v126, v127);
    TLOAD(v124, v128);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID0);
    // pto: %17
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v129 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %17
    uint64_t v130 = (uint64_t) v26;
    TASSIGN(v129, v130);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID5);
    TMULS(v129, v109, v105);
    // pto: %18
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v131 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %18
    uint64_t v132 = (uint64_t) v26;
    TASSIGN(v131, v132);
    TADD(v131, v102, v129);
    // pto: %19
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v133 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %19
    uint64_t v134 = (uint64_t) v23;
    TASSIGN(v133, v134);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID6);
    TMULS(v133, v114, v106);
    // pto: %20
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v135 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %20
    uint64_t v136 = (uint64_t) v26;
    TASSIGN(v135, v136);
    TADD(v135, v131, v133);
    // pto: %21
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v137 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %21
    uint64_t v138 = (uint64_t) v23;
    TASSIGN(v137, v138);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID7);
    TMULS(v137, v119, v107);
    // pto: %22
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v139 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %22
    uint64_t v140 = (uint64_t) v26;
    TASSIGN(v139, v140);
    TADD(v139, v135, v137);
    // pto: %23
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v141 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %23
    uint64_t v142 = (uint64_t) v23;
    TASSIGN(v141, v142);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID0);
    TMULS(v141, v124, v108);
    // pto: %24
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v143 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %24
    uint64_t v144 = (uint64_t) v24;
    TASSIGN(v143, v144);
    TADD(v143, v139, v141);
    set_flag(PIPE_V, PIPE_MTE2, EVENT_ID0);
    set_flag(PIPE_V, PIPE_MTE3, EVENT_ID1);
    // pto: %y_flat_inline7__tile_pview
    pto::Shape<1, 1, 1, 1, 7168> v145 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %y_flat_inline7__tile_pview
    pto::Stride<28672, 28672, 28672, 28672, 1> v146 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %y_flat_inline7__tile_pview
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v147 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v1 + ((v23 + v43 * v22) + v96), v145, v146);
    wait_flag(PIPE_V, PIPE_MTE3, EVENT_ID1);
    TSTORE(v147, v143);
    set_flag(PIPE_MTE3, PIPE_V, EVENT_ID0);
  }
  set_flag(PIPE_MTE3, PIPE_V, EVENT_ID2);
  set_flag(PIPE_V, PIPE_MTE2, EVENT_ID3);
  // pto: %120, %121, %122
  wait_flag(PIPE_V, PIPE_MTE2, EVENT_ID3);
  wait_flag(PIPE_MTE3, PIPE_V, EVENT_ID2);
  if ((int64_t) ((uint64_t) ((int64_t) ((uint64_t) v29 - (uint64_t) v30)) + (uint64_t) v19) == v20) {
    // pto: %124, %125, %123
    float v148 = (v2)[(int64_t) ((uint64_t) ((int64_t) ((uint64_t) v30 * (uint64_t) v19)) + (uint64_t) v28)];
    // pto: %25
    Tile<TileType::Vec, bfloat16_t, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v149 = Tile<TileType::Vec, bfloat16_t, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %25
    uint64_t v150 = (uint64_t) v26;
    TASSIGN(v149, v150);
    // pto: %126
    int64_t v151 = v30 < v23 ? v23 : v30;
    // pto: %127
    pto::Shape<1, 1, 1, 1, 7168> v152 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %127
    pto::Stride<7168, 7168, 7168, 7168, 1> v153 = pto::Stride<7168, 7168, 7168, 7168, 1>();
    // pto: %127
    GlobalTensor<bfloat16_t, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<7168, 7168, 7168, 7168, 1>, pto::Layout::ND> v154 = GlobalTensor<bfloat16_t, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<7168, 7168, 7168, 7168, 1>, pto::Layout::ND>(v3 + (v23 + v151 * v18), v152, v153);
    TLOAD(v149, v154);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID0);
    // pto: %26
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v155 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %26
    uint64_t v156 = (uint64_t) v24;
    TASSIGN(v155, v156);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID0);
    TCVT(v155, v149, v13, v12);
    set_flag(PIPE_V, PIPE_MTE2, EVENT_ID4);
    // pto: %27
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v157 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %27
    uint64_t v158 = (uint64_t) v24;
    TASSIGN(v157, v158);
    TMULS(v157, v155, v148);
    // pto: %129
    int64_t v159 = (int64_t) ((uint64_t) v30 * (uint64_t) v17);
    // pto: %130, %128
    float v160 = (v4)[(int64_t) ((uint64_t) v159 + (uint64_t) v28)];
    // pto: %134, %132, %131
    float v161 = (v4)[(int64_t) ((uint64_t) v159 + (uint64_t) ((int64_t) ((uint64_t) v28 + (uint64_t) v19)))];
    // pto: %138, %136, %135
    float v162 = (v4)[(int64_t) ((uint64_t) v159 + (uint64_t) ((int64_t) ((uint64_t) v28 + (uint64_t) v15)))];
    // pto: %142, %140, %139
    float v163 = (v4)[(int64_t) ((uint64_t) v159 + (uint64_t) ((int64_t) ((uint64_t) v28 + (uint64_t) v14)))];
    // pto: %28
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v164 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %28
    uint64_t v165 = (uint64_t) v26;
    TASSIGN(v164, v165);
    // pto: %145
    pto::Shape<1, 1, 1, 1, 7168> v166 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %145
    pto::Stride<28672, 28672, 28672, 28672, 1> v167 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %145
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v168 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v5 + (v23 + v151 * v22), v166, v167);
    wait_flag(PIPE_V, PIPE_MTE2, EVENT_ID4);
    TLOAD(v164, v168);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID0);
    // pto: %29
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v169 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %29
    uint64_t v170 = (uint64_t) v23;
    TASSIGN(v169, v170);
    // pto: %148
    pto::Shape<1, 1, 1, 1, 7168> v171 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %148
    pto::Stride<28672, 28672, 28672, 28672, 1> v172 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %148
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v173 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v5 + (v18 + v151 * v22), v171, v172);
    TLOAD(v169, v173);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID1);
    // pto: %30
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v174 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %30
    uint64_t v175 = (uint64_t) v22;
    TASSIGN(v174, v175);
    // pto: %151
    pto::Shape<1, 1, 1, 1, 7168> v176 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %151
    pto::Stride<28672, 28672, 28672, 28672, 1> v177 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %151
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v178 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v5 + (v11 + v151 * v22), v176, v177);
    TLOAD(v174, v178);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID2);
    // pto: %31
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v179 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %31
    uint64_t v180 = (uint64_t) v21;
    TASSIGN(v179, v180);
    // pto: %154
    pto::Shape<1, 1, 1, 1, 7168> v181 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %154
    pto::Stride<28672, 28672, 28672, 28672, 1> v182 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %154
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v183 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v5 + (v10 + v151 * v22), v181, v182);
    TLOAD(v179, v183);
    set_flag(PIPE_MTE2, PIPE_V, EVENT_ID3);
    // pto: %32
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v184 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %32
    uint64_t v185 = (uint64_t) v26;
    TASSIGN(v184, v185);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID0);
    TMULS(v184, v164, v160);
    // pto: %33
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v186 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %33
    uint64_t v187 = (uint64_t) v26;
    TASSIGN(v186, v187);
    TADD(v186, v157, v184);
    // pto: %34
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v188 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %34
    uint64_t v189 = (uint64_t) v23;
    TASSIGN(v188, v189);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID1);
    TMULS(v188, v169, v161);
    // pto: %35
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v190 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %35
    uint64_t v191 = (uint64_t) v26;
    TASSIGN(v190, v191);
    TADD(v190, v186, v188);
    // pto: %36
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v192 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %36
    uint64_t v193 = (uint64_t) v23;
    TASSIGN(v192, v193);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID2);
    TMULS(v192, v174, v162);
    // pto: %37
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v194 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %37
    uint64_t v195 = (uint64_t) v26;
    TASSIGN(v194, v195);
    TADD(v194, v190, v192);
    // pto: %38
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v196 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %38
    uint64_t v197 = (uint64_t) v23;
    TASSIGN(v196, v197);
    wait_flag(PIPE_MTE2, PIPE_V, EVENT_ID3);
    TMULS(v196, v179, v163);
    // pto: %39
    Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null> v198 = Tile<TileType::Vec, float, 1, 7168, BLayout::RowMajor, -1, -1, SLayout::NoneBox, 512, PadValue::Null, CompactMode::Null>(v20, v18);
    // pto: %39
    uint64_t v199 = (uint64_t) v24;
    TASSIGN(v198, v199);
    TADD(v198, v194, v196);
    set_flag(PIPE_V, PIPE_MTE3, EVENT_ID2);
    // pto: %157
    int64_t v200 = (int64_t) ((uint64_t) v28 * (uint64_t) v18);
    // pto: %y_flat_inline7__rv_v2_main_pview
    pto::Shape<1, 1, 1, 1, 7168> v201 = pto::Shape<1, 1, 1, 1, 7168>();
    // pto: %y_flat_inline7__rv_v2_main_pview
    pto::Stride<28672, 28672, 28672, 28672, 1> v202 = pto::Stride<28672, 28672, 28672, 28672, 1>();
    // pto: %y_flat_inline7__rv_v2_main_pview, %158
    GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND> v203 = GlobalTensor<float, pto::Shape<1, 1, 1, 1, 7168>, pto::Stride<28672, 28672, 28672, 28672, 1>, pto::Layout::ND>(v1 + ((v23 + v151 * v22) + (v200 < v23 ? v23 : v200)), v201, v202);
    wait_flag(PIPE_V, PIPE_MTE3, EVENT_ID2);
    TSTORE(v203, v198);
  }
  wait_flag(PIPE_V, PIPE_MTE2, EVENT_ID0);
  wait_flag(PIPE_MTE3, PIPE_V, EVENT_ID0);
  #endif // __DAV_VEC__

  ptoas_auto_sync_tail(PTOAutoSyncTailMode::kBarrierAll);
  return;
}