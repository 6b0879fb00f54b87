(* Merge sort over an ordering: top-down on arrays with one scratch buffer and an
   insertion-sort cutoff, and bottom-up on lists. Both are stable. *)

module Make (O : Ord.S) = struct
  let le a b = O.compare a b <= 0

  let insertion a lo hi =
    for i = lo + 1 to hi - 1 do
      let v = a.(i) in
      let j = ref (i - 1) in
      while !j >= lo && not (le a.(!j) v) do
        a.(!j + 1) <- a.(!j);
        decr j
      done;
      a.(!j + 1) <- v
    done

  (* merges src[lo, mid) and src[mid, hi) into dst[lo, hi) *)
  let merge src dst lo mid hi =
    let i = ref lo and j = ref mid in
    for k = lo to hi - 1 do
      if !i < mid && (!j >= hi || le src.(!i) src.(!j)) then begin
        dst.(k) <- src.(!i);
        incr i
      end
      else begin
        dst.(k) <- src.(!j);
        incr j
      end
    done

  (* sorts a[lo, hi), using tmp[lo, hi) as scratch *)
  let rec sort_range a tmp lo hi =
    if hi - lo <= 12 then insertion a lo hi
    else begin
      let mid = lo + ((hi - lo) / 2) in
      sort_range a tmp lo mid;
      sort_range a tmp mid hi;
      if not (le a.(mid - 1) a.(mid)) then begin
        Array.blit a lo tmp lo (hi - lo);
        merge tmp a lo mid hi
      end
    end

  let sort_array a =
    let n = Array.length a in
    if n > 1 then sort_range a (Array.sub a 0 n) 0 n

  let rec merge_lists acc l1 l2 =
    match (l1, l2) with
    | [], l | l, [] -> List.rev_append acc l
    | x :: r1, y :: r2 -> if le x y then merge_lists (x :: acc) r1 l2 else merge_lists (y :: acc) l1 r2

  let rec pass = function
    | a :: b :: rest -> merge_lists [] a b :: pass rest
    | short -> short

  let rec until_one = function [] -> [] | [ l ] -> l | runs -> until_one (pass runs)

  let sort_list l = until_one (List.map (fun x -> [ x ]) l)

  let is_sorted_array a =
    let ok = ref true in
    for i = 1 to Array.length a - 1 do
      if not (le a.(i - 1) a.(i)) then ok := false
    done;
    !ok

  let rec is_sorted_list = function a :: (b :: _ as r) -> le a b && is_sorted_list r | _ -> true
end
