(* Merge sort, quicksort and heap sort, once through an ordering functor and once with
   a comparison closure; all share small helpers (swap, less) that must inline well. *)

module type ORDERED = sig
  type t
  val compare : t -> t -> int
end

module Make (O : ORDERED) = struct
  let less a b = O.compare a b < 0

  let merge_sort l =
    let rec merge acc a b =
      match (a, b) with
      | [], r | r, [] -> List.rev_append acc r
      | x :: xs, y :: ys -> if less y x then merge (y :: acc) a ys else merge (x :: acc) xs b
    in
    let rec split l a b = match l with [] -> (a, b) | x :: rest -> split rest b (x :: a) in
    let rec sort = function
      | ([] | [ _ ]) as l -> l
      | l ->
          let a, b = split l [] [] in
          merge [] (sort a) (sort b)
    in
    sort l

  let swap a i j =
    let t = a.(i) in
    a.(i) <- a.(j);
    a.(j) <- t

  let insertion_sort a lo hi =
    for i = lo + 1 to hi do
      let v = a.(i) in
      let j = ref (i - 1) in
      while !j >= lo && less v a.(!j) do
        a.(!j + 1) <- a.(!j);
        decr j
      done;
      a.(!j + 1) <- v
    done

  let quicksort a =
    let rec qs lo hi =
      if hi - lo < 12 then insertion_sort a lo hi
      else begin
        let mid = lo + ((hi - lo) / 2) in
        if less a.(mid) a.(lo) then swap a mid lo;
        if less a.(hi) a.(lo) then swap a hi lo;
        if less a.(hi) a.(mid) then swap a hi mid;
        let pivot = a.(mid) in
        let i = ref lo and j = ref hi in
        while !i <= !j do
          while less a.(!i) pivot do incr i done;
          while less pivot a.(!j) do decr j done;
          if !i <= !j then begin
            swap a !i !j;
            incr i;
            decr j
          end
        done;
        qs lo !j;
        qs !i hi
      end
    in
    qs 0 (Array.length a - 1)

  let heapsort a =
    let n = Array.length a in
    let rec sift i size =
      let l = (2 * i) + 1 in
      if l < size then begin
        let c = if l + 1 < size && less a.(l) a.(l + 1) then l + 1 else l in
        if less a.(i) a.(c) then begin
          swap a i c;
          sift c size
        end
      end
    in
    for i = (n / 2) - 1 downto 0 do sift i n done;
    for last = n - 1 downto 1 do
      swap a 0 last;
      sift 0 last
    done

  let is_sorted a =
    let ok = ref true in
    for i = 1 to Array.length a - 1 do if less a.(i) a.(i - 1) then ok := false done;
    !ok
end

(* the same algorithms with the ordering as a closure argument *)
let merge_sort_by cmp l =
  let module M = Make (struct type t = int let compare = cmp end) in
  M.merge_sort l

let rec quicksort_by cmp = function
  | [] -> []
  | p :: rest ->
      let lo, hi = List.partition (fun x -> cmp x p < 0) rest in
      quicksort_by cmp lo @ (p :: quicksort_by cmp hi)
